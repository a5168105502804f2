"""One server process and talking to it: launch and teardown, the client, /metrics, host load."""
