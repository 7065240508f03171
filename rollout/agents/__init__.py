"""The agent-facing side: the Agent client harnesses call, and the OpenAI-compatible gateway for agents
written against other APIs."""
