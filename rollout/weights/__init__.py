"""Weight movement, imported by both sides: the transports and the collective group between a learner and its
engines, the sync methods the trainer drives, the WeightStore a restarted engine loads from, and LoRA names.
It sits in rollout/ (the lower layer): the engine side imports it, and trainer/ already imports rollout/."""
