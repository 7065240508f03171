"""Tests of rollout/engine/: the Engine actor, its core thread, LoRA, the weight group."""
