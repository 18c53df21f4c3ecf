# The harness versions forgelog is tested with (sourced by install.sh and run.sh).
NODE_VERSION=22.23.3
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
OPENCODE_VERSION=1.18.33
MINI_SWE_AGENT_VERSION=2.4.6
