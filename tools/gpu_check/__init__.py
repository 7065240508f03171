"""The GPU readiness check, `python -m tools.gpu_check` (`__main__`: the stage runner); its stages
`transport`, `ipc` (with the processes it starts, `roles`) and `stack`. Nothing here imports torch at
package import: the runner is standard library only."""
