# Cline's CLI (`cline --json TASK`: act mode, every tool auto-approved), its
# OpenAI-compatible provider on the proxy, set by `cline auth` in its own
# state under the sandbox's home. The npm package's `cline` is a native
# binary (the platform package's), not a node script. Its telemetry service
# starts only for a Cline account (none here); OpenTelemetry export is off
# unless asked for.
cline="$FORGELOG_BUNDLES/cline/node_modules/.bin/cline"
"$cline" auth -p openai -k "$FORGELOG_API_KEY" -m forgelog -b "$FORGELOG_BASE_URL/v1" >&2
exec "$cline" --json -P openai -m forgelog "$(cat "$FORGELOG_INSTRUCTION")"
