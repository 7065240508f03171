"""The engine and everything that runs inside vLLM: the Engine actor, its vLLM arguments and in-process core
thread, the step clock, the worker extension loaded into vLLM's workers, and the CPU LoRA ops; and the
receiving end of the weight push, which the trainer's sending end meets: the weight group both ends join,
the WeightStore a restarted engine loads from, and the LoRA adapter names both sides use."""
