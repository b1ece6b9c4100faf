"""Texts the loop guard must stop (LOOPS: one unit of tokens repeated exactly) and must let through
(LEGITIMATE: lists, tables, code and rules, whose markup repeats but whose content changes). The unit
tests feed them through a word-level tokenizer (tests/unit/test_loop_guard.py), the engine tests
through the model's own (tests/system/engine/test_answer_quality.py)."""

from __future__ import annotations

SENTENCE = "The document explains how the package manager installs programs and their dependencies. "
TWO_SENTENCES = (
    "It describes the configuration files in detail. "
    "It also lists the commands that an administrator uses every day. "
)
LOOPS = {
    "one sentence over and over": "Summary: " + SENTENCE * 8,
    "two sentences over and over": "The text is about Debian. " + TWO_SENTENCES * 6,
    "one word": "and " * 80,
    "dots": "The answer is" + "." * 16 * 200,
    "a table row over and over": "| Name | Value |\n|---|---|\n"
    + "| timeout | 30 seconds for each request |\n" * 12,
}

NUMBERED_LIST = "".join(
    f"{n}. Step {n}: run the command for stage {n} and check its output.\n" for n in range(1, 41)
)
BULLETS = "".join(
    f"- The document discusses the {topic} of the system.\n"
    for topic in ("history", "design", "installation", "configuration", "security", "testing", "packaging",
                  "licensing", "translation", "documentation", "performance", "future")
)  # fmt: skip
CHECKLIST = "".join(f"- [ ] item{n}\n" for n in range(60))
TABLE = "| Option | Default | Meaning |\n|---|---|---|\n" + "".join(
    f"| option_{n} | {n * 10} | sets limit number {n} |\n" for n in range(40)
)
CHECKMARK_TABLE = "| Feature | A | B | C | D |\n|---|---|---|---|---|\n" + "".join(
    f"| feature {n} | ✓ | ✓ | ✗ | ✓ |\n" for n in range(30)
)
WIDE_SEPARATOR = "| " + " | ".join(f"c{n}" for n in range(40)) + " |\n|" + "---|" * 40 + "\n"
RULE = "=" * 78 + "\nHeading\n" + "-" * 78 + "\n"
CODE = "".join(f"    value_{n} = compute(value_{n - 1}, step={n})\n" for n in range(1, 40))
CSV = "year,month,count\n" + "".join(f"2024,{m},{m * 7 % 11}\n" for m in range(1, 13)) * 1
LEGITIMATE = {
    "numbered list": NUMBERED_LIST,
    "bullets with a shared opening": BULLETS,
    "checklist": CHECKLIST,
    "table": TABLE,
    "table of check marks": CHECKMARK_TABLE,
    "40-column separator row": WIDE_SEPARATOR,
    "rules": RULE,
    "code": CODE,
    "csv": CSV,
}
