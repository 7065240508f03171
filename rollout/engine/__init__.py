"""The engine and everything that runs inside vLLM: the Engine actor, its vLLM arguments and in-process core
thread, the step clock, the worker extension loaded into vLLM's workers, and the CPU LoRA ops."""
