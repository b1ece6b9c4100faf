"""What the model is asked when it summarizes, in the language the answer should be in.

A small model answers in the language it is spoken to far more reliably than
in the one it is told to use, so each instruction is written in the answer's
language where we have a translation, and names that language either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.documents.language import DEFAULT_LANGUAGE, language_name
from services.engine import Message


@dataclass(frozen=True)
class Wording:
    """The instructions in one language; short, with no list of what to keep (a small model copies
    such lists into the summary)."""

    summarize: str  # the request is empty
    answer_request: str  # appended after the user's own request
    map_part: str
    reduce: str


WORDINGS = {
    "en": Wording(
        "Summarize the document above in a few paragraphs: its purpose, its main points section by "
        "section, and its conclusions. Keep the names, commands and numbers that matter.",
        "(Answer about the document above, in English.)",
        "Summarize the text the user sends in one short paragraph.",
        "The user sends notes on one document, in order. Write one summary of that document from them, "
        "in a few paragraphs.",
    ),
    "pt": Wording(
        "Resuma o documento acima em alguns parágrafos, em português: o seu objetivo, os pontos "
        "principais de cada secção e as conclusões. Mantenha os nomes, comandos e números importantes.",
        "(Responda sobre o documento acima, em português.)",
        "Resuma o texto que o utilizador envia num parágrafo curto, em português.",
        "O utilizador envia notas sobre um documento, por ordem. Escreva com elas um único resumo desse "
        "documento, em alguns parágrafos, em português.",
    ),
    "es": Wording(
        "Resume el documento anterior en unos párrafos, en español: su propósito, los puntos "
        "principales de cada sección y sus conclusiones. Conserva los nombres, órdenes y cifras importantes.",
        "(Responde sobre el documento anterior, en español.)",
        "Resume el texto que envía el usuario en un párrafo breve, en español.",
        "El usuario envía notas sobre un documento, en orden. Escribe con ellas un único resumen de ese "
        "documento, en unos párrafos, en español.",
    ),
    "fr": Wording(
        "Résume le document ci-dessus en quelques paragraphes, en français : son objectif, ses points "
        "principaux section par section et ses conclusions. Garde les noms, commandes et chiffres "
        "importants.",
        "(Réponds à propos du document ci-dessus, en français.)",
        "Résume le texte que l'utilisateur envoie en un court paragraphe, en français.",
        "L'utilisateur envoie des notes sur un document, dans l'ordre. Écris avec elles un seul résumé de ce "
        "document, en quelques paragraphes, en français.",
    ),
    "de": Wording(
        "Fasse das obige Dokument in einigen Absätzen auf Deutsch zusammen: seinen Zweck, die "
        "wichtigsten Punkte jedes Abschnitts und seine Schlussfolgerungen. Behalte wichtige Namen, "
        "Befehle und Zahlen bei.",
        "(Antworte zum obigen Dokument, auf Deutsch.)",
        "Fasse den Text, den der Nutzer sendet, in einem kurzen Absatz auf Deutsch zusammen.",
        "Der Nutzer sendet Notizen zu einem Dokument, der Reihe nach. Schreibe daraus eine einzige "
        "Zusammenfassung dieses Dokuments, in einigen Absätzen, auf Deutsch.",
    ),
    "it": Wording(
        "Riassumi il documento qui sopra in alcuni paragrafi, in italiano: il suo scopo, i punti "
        "principali di ogni sezione e le conclusioni. Mantieni i nomi, i comandi e i numeri importanti.",
        "(Rispondi riguardo al documento qui sopra, in italiano.)",
        "Riassumi il testo che l'utente invia in un breve paragrafo, in italiano.",
        "L'utente invia note su un documento, in ordine. Scrivi con esse un unico riassunto di quel "
        "documento, in alcuni paragrafi, in italiano.",
    ),
}
WRITE_IN = " Write your answer in {language}."  # for languages without a translation


def wording(language: str) -> Wording:
    """The instructions in `language`; English ones that name the language where we have no translation."""
    if language in WORDINGS:
        return WORDINGS[language]
    english = WORDINGS[DEFAULT_LANGUAGE]
    suffix = WRITE_IN.format(language=language_name(language))
    return Wording(
        english.summarize + suffix,
        f"(Answer about the document above, in {language_name(language)}.)",
        english.map_part + suffix,
        english.reduce + suffix,
    )


def document_system_message(system_prompt: str, name: str, text: str) -> Message:
    """The system message that carries a document; identical for summary and follow-ups."""
    return {
        "role": "system",
        "content": f"{system_prompt}\n\nThe user shared the document «{name}». Its full text:\n\n"
        f"<document>\n{text}\n</document>",
    }


@dataclass(frozen=True)
class SummaryPrompts:
    """The prompts of one summary: single pass, map parts, reduce; all in the answer's language."""

    language: str
    request: str = ""

    def single_pass(self, system_prompt: str, name: str, text: str) -> list[Message]:
        return [document_system_message(system_prompt, name, text), self.instruction()]

    def instruction(self) -> Message:
        """The user turn after the document: the request (with the language) or the default one."""
        words = wording(self.language)
        request = self.request.strip()
        return {
            "role": "user",
            "content": f"{request}\n\n{words.answer_request}" if request else words.summarize,
        }

    def map_part(self, system_prompt: str, chunk: str, index: int, total: int) -> list[Message]:
        """The chunk alone in the user turn; the short instruction goes with the system prompt."""
        return self._instructed(system_prompt, wording(self.language).map_part, chunk)

    def reduce(self, system_prompt: str, partials: list[str]) -> list[Message]:
        joined = "\n\n".join(without_repeated_sentences(partials))
        return self._instructed(system_prompt, wording(self.language).reduce, joined)

    def _instructed(self, system_prompt: str, instruction: str, text: str) -> list[Message]:
        """Instructions in the system message, the text to read alone in the user message.

        Written after the text, the small model took the instructions for part of what
        it was reading and summarized them too ("The document contains key facts, names,
        commands and numbers...").
        """
        if self.request.strip():
            instruction += f"\n\n«{self.request.strip()}»"
        return [
            {"role": "system", "content": f"{system_prompt}\n\n{instruction}"},
            {"role": "user", "content": text},
        ]


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
REPEATED_SHARE = 0.6  # a sentence whose word 4-grams mostly appeared before adds nothing new


def without_repeated_sentences(partials: list[str]) -> list[str]:
    """The partial summaries, in order, without sentences that mostly repeat earlier ones.

    A small model opens every part the same way ("This document is part of a longer document...")
    and the reduce step copies what it reads: repeated lead-ins came back as repeated sentences in
    the final summary (distinct-4 0.59-0.80 on three of five long documents).
    """
    seen: set[tuple[str, ...]] = set()  # word 4-grams, and short sentences whole
    kept_partials = []
    for partial in partials:
        kept = []
        for sentence in SENTENCE_END.split(partial.strip()):
            words = sentence.lower().split()
            if not words:
                continue
            grams = {tuple(words[i : i + 4]) for i in range(len(words) - 3)} or {tuple(words)}
            if len(grams & seen) >= REPEATED_SHARE * len(grams):
                continue
            seen |= grams
            kept.append(sentence)
        if kept:
            kept_partials.append(" ".join(kept))
    return kept_partials or [p.strip() for p in partials]
