#!/bin/bash
set -euo pipefail
sed -i 's/\bteh\b/the/g' /app/notes.md
