#!/bin/bash
set -euo pipefail
ls -S /app/files | head -n 1 > /app/largest.txt
