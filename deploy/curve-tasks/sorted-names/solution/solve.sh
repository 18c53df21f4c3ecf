#!/bin/bash
set -euo pipefail
sort /app/names.txt > /app/sorted.txt
