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
    """The instructions in one language; {n}, {total}, {language} are filled in."""

    summarize: str  # the request is empty
    answer_request: str  # appended after the user's own request
    map_part: str
    reduce: str


WORDINGS = {
    "en": Wording(
        "Summarize the document above in a few paragraphs: its purpose, its main points section by "
        "section, and its conclusions. Keep the names, commands and numbers that matter.",
        "(Answer about the document above, in English.)",
        "This is part {n} of {total} of a longer document. Summarize this part in one short paragraph: "
        "keep its key facts, names, commands and numbers.",
        "Above are notes on consecutive parts of one document. Write one summary of the whole "
        "document in your own words, in a few paragraphs: its purpose, its main points and its "
        "conclusions. Do not list the parts and do not repeat a sentence.",
    ),
    "pt": Wording(
        "Resuma o documento acima em alguns parágrafos, em português: o seu objetivo, os pontos "
        "principais de cada secção e as conclusões. Mantenha os nomes, comandos e números importantes.",
        "(Responda sobre o documento acima, em português.)",
        "Esta é a parte {n} de {total} de um documento mais longo. Resuma esta parte num parágrafo "
        "curto, em português: mantenha os factos, nomes, comandos e números principais.",
        "Acima estão notas sobre partes consecutivas de um documento. Escreva um único resumo do "
        "documento inteiro por palavras suas, em alguns parágrafos, em português: o objetivo, os pontos "
        "principais e as conclusões. Não enumere as partes nem repita frases.",
    ),
    "es": Wording(
        "Resume el documento anterior en unos párrafos, en español: su propósito, los puntos "
        "principales de cada sección y sus conclusiones. Conserva los nombres, órdenes y cifras importantes.",
        "(Responde sobre el documento anterior, en español.)",
        "Esta es la parte {n} de {total} de un documento más largo. Resume esta parte en un párrafo "
        "breve, en español: conserva sus datos, nombres, órdenes y cifras clave.",
        "Arriba hay notas sobre partes consecutivas de un documento. Escribe un único resumen del "
        "documento completo con tus propias palabras, en unos párrafos, en español: su propósito, sus "
        "puntos principales y sus conclusiones. No enumeres las partes ni repitas frases.",
    ),
    "fr": Wording(
        "Résume le document ci-dessus en quelques paragraphes, en français : son objectif, ses points "
        "principaux section par section et ses conclusions. Garde les noms, commandes et chiffres "
        "importants.",
        "(Réponds à propos du document ci-dessus, en français.)",
        "Voici la partie {n} sur {total} d'un document plus long. Résume cette partie en un court "
        "paragraphe, en français : garde ses faits, noms, commandes et chiffres essentiels.",
        "Ci-dessus, des notes sur des parties consécutives d'un même document. Écris un seul résumé "
        "du document entier avec tes propres mots, en quelques paragraphes, en français : son objectif, "
        "ses points principaux et ses conclusions. N'énumère pas les parties et ne répète aucune phrase.",
    ),
    "de": Wording(
        "Fasse das obige Dokument in einigen Absätzen auf Deutsch zusammen: seinen Zweck, die "
        "wichtigsten Punkte jedes Abschnitts und seine Schlussfolgerungen. Behalte wichtige Namen, "
        "Befehle und Zahlen bei.",
        "(Antworte zum obigen Dokument, auf Deutsch.)",
        "Dies ist Teil {n} von {total} eines längeren Dokuments. Fasse diesen Teil in einem kurzen "
        "Absatz auf Deutsch zusammen: behalte die wichtigsten Fakten, Namen, Befehle und Zahlen.",
        "Oben stehen Notizen zu aufeinanderfolgenden Teilen eines Dokuments. Schreibe eine einzige "
        "Zusammenfassung des ganzen Dokuments in eigenen Worten, in einigen Absätzen, auf Deutsch: "
        "Zweck, wichtigste Punkte und Schlussfolgerungen. Zähle die Teile nicht auf und wiederhole "
        "keinen Satz.",
    ),
    "it": Wording(
        "Riassumi il documento qui sopra in alcuni paragrafi, in italiano: il suo scopo, i punti "
        "principali di ogni sezione e le conclusioni. Mantieni i nomi, i comandi e i numeri importanti.",
        "(Rispondi riguardo al documento qui sopra, in italiano.)",
        "Questa è la parte {n} di {total} di un documento più lungo. Riassumi questa parte in un breve "
        "paragrafo, in italiano: mantieni i fatti, i nomi, i comandi e i numeri principali.",
        "Qui sopra ci sono i riassunti di parti consecutive di un documento. Uniscili in un unico "
        "riassunto dell'intero documento, in italiano: scopo, punti principali di ogni parte e conclusioni.",
    ),
}
WRITE_IN = " Write your answer in {language}."  # for languages without a translation


def wording(language: str) -> Wording:
    """The instructions in `language`; English ones that name the language where we have no translation."""
    if language in WORDINGS:
        return WORDINGS[language]
    english, suffix = WORDINGS[DEFAULT_LANGUAGE], WRITE_IN.format(language=language_name(language))
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
        text = wording(self.language).map_part.format(n=index, total=total)
        if self.request.strip():
            text += f"\n{self.request.strip()}"
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"{chunk}\n\n---\n{text}"},
        ]

    def reduce(self, system_prompt: str, partials: list[str]) -> list[Message]:
        joined = "\n\n".join(without_repeated_sentences(partials))
        text = wording(self.language).reduce
        if self.request.strip():
            text += f"\n\n«{self.request.strip()}»"
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"{joined}\n\n---\n{text}"},
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
