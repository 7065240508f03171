"""The agent API harnesses call: the Agent client with its token-exact Conversation and trace recorder,
over a policy's chat format."""
