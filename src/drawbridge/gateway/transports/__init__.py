"""The agents' side: wrap's stdio relay, serve's sessions over stdio and streamable HTTP, and this
process's own stdin and stdout. A transport moves bytes and hands every tools/call to the pipeline."""
