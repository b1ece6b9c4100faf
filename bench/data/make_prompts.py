"""Write bench/data/prompts.json: the prompt mix of the load test and the benchmarks.

Run once; the output is committed so every run sends the same text:
    .venv/bin/python bench/data/make_prompts.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.documents import long_document

OUT = ROOT / "bench" / "data" / "prompts.json"

SHORT_QUESTIONS = (
    "What is the capital of France?",
    "How many days are there in a leap year?",
    "Give me three tips for a good night's sleep.",
    "What does a CPU do in a computer?",
    "Explain photosynthesis in one sentence.",
    "What is the boiling point of water at sea level?",
    "Name three primary colors.",
    "How do I boil an egg?",
    "What is the difference between weather and climate?",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Why is the sky blue?",
    "Suggest a name for a small bakery.",
    "What is a prime number?",
    "How many continents are there?",
    "Translate 'good morning' into Spanish.",
    "What is the largest planet in the solar system?",
    "Give me a synonym for 'happy'.",
    "What is the main ingredient of guacamole?",
    "How do plants get water?",
    "What is an email subject line for a meeting reminder?",
    "Explain what a password manager is.",
    "What should I pack for a day hike?",
    "Who wrote Romeo and Juliet?",
    "What is the freezing point of water in Fahrenheit?",
    "List three uses of a paperclip.",
    "What is the plural of 'mouse'?",
    "How can I save money on groceries?",
    "What is the speed of light, roughly?",
    "Describe a cat in two sentences.",
    "What is a good warm-up before running?",
    "Why do leaves change color in the fall?",
    "What is the chemical symbol for gold?",
    "How many minutes are in three hours?",
    "Recommend a simple dinner recipe.",
    "What is the opposite of 'ancient'?",
    "How does a rainbow form?",
    "Give one reason to learn a second language.",
    "What is the tallest animal?",
    "Say hello in a friendly way.",
)

DOCUMENT_INSTRUCTIONS = (
    "Summarize the main points of this report in three sentences.",
    "What are the biggest risks mentioned in this report?",
    "List the sections of this report and one key fact from each.",
    "Write a short executive summary of the following document.",
)

# (words, seed): about 1.23 tokens per word with the default tokenizer, so the
# longest (~3,100 tokens) still fits the tiny test model's 4,096-token context.
DOCUMENTS = ((600, 11), (900, 12), (1200, 13), (1500, 14), (1800, 15), (2100, 16), (2500, 17))


def build() -> dict:
    """The prompt set: short questions and long documents with an instruction each."""
    documents = []
    for index, (words, seed) in enumerate(DOCUMENTS):
        instruction = DOCUMENT_INSTRUCTIONS[index % len(DOCUMENT_INSTRUCTIONS)]
        documents.append({"words": words, "prompt": f"{instruction}\n\n{long_document(words, seed)}"})
    return {"short": list(SHORT_QUESTIONS), "long": documents}


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB)")
