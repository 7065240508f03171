"""What tests and benches feed the verifiers and the openai_agent harness: hostile answers
(`hostile_answers`), the reward-hack corpus (`reward_hacks`) and two one-call OpenAI-SDK agents
(`one_call_agents`, a harness target from the checkout as `examples.*` are)."""
