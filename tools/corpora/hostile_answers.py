"""Answers a hostile model could give to an arithmetic task: code that would create a file if
anything evaluated it, and answers built to take a verifier's time or memory. The scoring tests
(tests/tools/test_hostile_answers.py) and tools/bench/hostile.py score them against every
shipped reasoning-gym task."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The reasoning-gym presets (file tasks' verifiers: tests/harnesses/test_verifiers.py), but those
# that extend another (`defaults:`, e.g. chain_sum_two_terms): the same dataset with other params.
SHIPPED = sorted(
    p.stem
    for p in (ROOT / "conf" / "task").glob("*.yaml")
    if "_target_" not in p.read_text() and "defaults:" not in p.read_text()
)
TASKS = sorted(set(SHIPPED) | {"puzzle24"})


def payloads(target: Path) -> dict[str, str]:
    """Answers (tag contents) that would create `target` if evaluated, or take the verifier's time."""
    return {
        "os.system": f"__import__('os').system('touch {target}')",
        "open": f"open('{target}','w').write('x')",
        "pathlib": f"__import__('pathlib').Path('{target}').touch()",
        "subprocess": f"__import__('subprocess').run(['touch', '{target}'])",
        "power tower": "9**9**9**9",
        "400 kB expression": "1+" * 200000 + "1",
        "lambda": f"(lambda: __import__('os').system('touch {target}'))()",
        "sympy": f"Function('f')(1) or __import__('os').system('touch {target}')",
        "caret": "9^9^9^9",
        "deep parentheses": "(" * 5000 + "1" + ")" * 5000,
        "huge literal": "9" * 5000,
    }
