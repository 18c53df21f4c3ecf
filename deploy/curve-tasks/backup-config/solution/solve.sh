#!/bin/bash
set -euo pipefail
mkdir -p /app/backup && cp /app/app.conf /app/backup/
