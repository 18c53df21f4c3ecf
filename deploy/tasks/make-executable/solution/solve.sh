#!/bin/bash
set -euo pipefail
sed -i '1i #!/bin/sh' /app/run.sh && chmod +x /app/run.sh
