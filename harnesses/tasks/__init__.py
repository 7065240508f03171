"""Task sources (`TaskSource` subclasses, named by `task._target_`): reasoning-gym datasets (`reasoning_gym`),
the user's data files (`files`, whose rows `data_files` reads), Nim starting positions for self-play
(`games`), the digit task (`synthetic`), story sums for the relay (`story_sum`), an installed verifiers
environment's rows (`verifiers_env`) and TextArena games from seeds (`textarena`)."""
