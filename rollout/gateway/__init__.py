"""The OpenAI-compatible gateway for agents tracerl did not write: the HTTP server, its sessions, one
module per wire protocol (chat completions, the Responses API), and the prompt building that keeps a
resent history token-exact."""
