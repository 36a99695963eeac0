"""The tool gate's daemon side (Services): one broker per running agent, and
the `shell` tool's own process."""
