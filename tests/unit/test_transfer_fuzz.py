"""The three import formats fuzzed (the app's archive, its Markdown export, ChatGPT's
conversations.json, and bytes that are none of them): reading a file never raises anything but
BadImport with a plain sentence, never keeps more than the caps or an empty message, and what it
keeps comes back unchanged through the app's own export. Budgets come from the Hypothesis profile
(tests/tiers.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from services.transfer.archive import (
    MAX_TITLE_CHARS,
    BadImport,
    Conversation,
    ImportLimits,
    Message,
    archive_text,
    storable,
)
from services.transfer.markdown import HEADER, SPEAKERS, to_markdown
from services.transfer.reading import ImportRead, conversation_bytes, read_import

LIMITS = ImportLimits(
    max_conversations=4,
    max_messages=6,
    max_message_chars=60,
    max_stored_messages=9,
    max_stored_bytes=300,
    max_depth=12,
)

TITLE = "Imported conversation"  # a conversation's title when the file gives none

# Text with what trips readers: white space only, line ends of every kind, NUL, lone surrogates (a
# JSON file may carry them), markers and their escapes, and any other character.
TRICKY = [
    "", " ", "\t\n ", "\r", "\r\n", "\n", "\x00", "\ud800", "\udfff", "\u2028", "\x0b", "**You**",
    "**Assistant**", "<!-- message role=user -->", "\\<!-- message role=assistant -->",
    "<!-- vllm-chat-export version=1 -->", "# title", "\\\\<!-- message ", "«»", "é",
]  # fmt: skip
texts = st.lists(
    st.sampled_from(TRICKY) | st.text(st.characters(exclude_categories=()), max_size=12), max_size=5
).map("".join)
times = st.sampled_from(["2026-12-01T10:00:00Z", "9999-12-31T23:59:59-14:00", "x", "", 1.7e9, -1, 1e308])
scalars = st.none() | st.booleans() | st.integers() | st.floats() | texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


def maybe(
    strategy: st.SearchStrategy[Any], odd: st.SearchStrategy[Any] = json_values
) -> st.SearchStrategy[Any]:
    """Nine times in ten what the format holds, else `odd`: any JSON value (a wrong type or value)."""
    return st.integers(0, 9).flatmap(lambda n: odd if n == 9 else strategy)  # 0, the simplest: valid


roles = maybe(st.sampled_from(["user", "assistant", "user", "assistant", "system", "tool"]))
archive_messages = st.fixed_dictionaries(
    {"role": roles, "content": maybe(texts)}, optional={"created_at": maybe(times)}
)
archive_conversations = st.fixed_dictionaries(
    {"messages": maybe(st.lists(maybe(archive_messages), max_size=8))},
    optional={"title": maybe(texts), "created_at": maybe(times)},
)
archives = st.fixed_dictionaries(
    {
        "format": st.just("vllm-chat-archive"),
        "version": maybe(st.just(1)),
        "conversations": maybe(st.lists(archive_conversations, min_size=1, max_size=5)),
    }
)


CHATGPT_PARTS = [  # parts of a multimodal_text message besides strings, as ChatGPT writes them
    {"content_type": "image_asset_pointer", "asset_pointer": "file-service://file-1"},
    {"content_type": "audio_transcription", "text": "spoken"},
    {"content_type": "audio_transcription", "text": None},
    {"content_type": ["odd"]},
]


@st.composite
def chatgpt_nodes(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A mapping of nodes, each the child of an earlier one (else of any, or of none), and the node
    the conversation shows: a tree mostly, with cycles and missing nodes now and then."""
    keys = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True))
    mapping: dict[str, Any] = {}
    for index, key in enumerate(keys):
        kinds = st.sampled_from(["text", "text", "code", "multimodal_text"])
        part = st.one_of(maybe(texts), st.sampled_from(CHATGPT_PARTS))
        content = {"content_type": draw(maybe(kinds)), "parts": draw(maybe(st.lists(part, max_size=3))),
                   "text": draw(maybe(texts))}  # fmt: skip
        message = {"author": {"role": draw(roles)}, "content": draw(maybe(st.just(content))),
                   "create_time": draw(maybe(times))}  # fmt: skip
        anywhere = st.sampled_from([*keys, "zz"])  # a cycle, or a node that is not there
        parent = draw(maybe(st.sampled_from(keys[:index]) if index else st.none(), anywhere))
        mapping[key] = {"message": draw(maybe(st.just(message)) | st.none()), "parent": parent,
                        "children": draw(st.lists(st.sampled_from(keys), max_size=2))}  # fmt: skip
    return mapping, draw(maybe(st.sampled_from(keys)))


@st.composite
def chatgpt_exports(draw: st.DrawFn) -> list[Any]:
    """ChatGPT's shape (its conversations.json)."""
    conversations = []
    for _ in range(draw(st.integers(1, 4))):
        mapping, current = draw(chatgpt_nodes())
        conversations.append({"title": draw(maybe(texts)), "mapping": draw(maybe(st.just(mapping))),
                              "current_node": current, "create_time": draw(maybe(times))})  # fmt: skip
    return conversations


@st.composite
def markdown_files(draw: st.DrawFn) -> bytes:
    """The Markdown export's lines, well-formed or not, joined by any line end."""
    marker = st.builds(
        "<!-- message role={}{} -->".format,
        st.sampled_from(["user", "assistant"] * 5 + ["system", "x"]),
        st.sampled_from(["", " created_at=2026-12-01T10:00:00Z", " created_at=x"]),
    )
    line = st.one_of(marker, marker, st.sampled_from(list(SPEAKERS.values())), texts, texts)
    lines = [HEADER, draw(st.sampled_from(["# ", ""])) + draw(texts), *draw(st.lists(line, max_size=14))]
    text = "".join(part + draw(st.sampled_from(["\n", "\n", "\r\n", "\r"])) for part in lines)
    return text.encode("utf-8", "surrogatepass" if draw(st.booleans()) else "replace")


def as_json(document: Any) -> bytes:
    return json.dumps(document).encode()  # ASCII: lone surrogates travel as escapes, as JSON allows


files = st.one_of(
    archives.map(as_json),
    chatgpt_exports().map(as_json),
    markdown_files(),
    json_values.map(as_json),
    st.binary(max_size=64),
)


def read_or_refusal(data: bytes) -> ImportRead | str:
    """What the file brings, or the refusal's message, once checked: BadImport, a plain sentence."""
    try:
        return read_import(data, LIMITS)
    except BadImport as refused:
        message = str(refused)
        assert type(refused) is BadImport, repr(refused)
        assert message.endswith(".") and "\n" not in message and len(message) < 300, message
        assert "Error" not in message and "Traceback" not in message, message
        return message


def assert_within_caps(read: ImportRead) -> None:
    assert 1 <= len(read.conversations) <= LIMITS.max_conversations
    assert read.stored_messages <= LIMITS.max_stored_messages
    assert read.stored_bytes <= LIMITS.max_stored_bytes
    for conversation in read.conversations:
        assert conversation.messages and len(conversation.messages) <= LIMITS.max_messages
        assert 1 <= len(conversation.title) <= MAX_TITLE_CHARS
        for message in conversation.messages:
            assert message.role in ("user", "assistant") and message.content.strip()
            assert len(message.content) <= LIMITS.max_message_chars
        for kept in (conversation.title, *(m.content for m in conversation.messages)):
            assert "\x00" not in kept and kept.encode("utf-8")  # the database keeps it as it is
    assert read.stored_bytes == sum(conversation_bytes(c) for c in read.conversations)


def assert_round_trips(read: ImportRead, markdown: bool) -> None:
    """What was kept comes back the same from the app's archive (and Markdown, for a Markdown file)."""
    archived = archive_text(read.conversations, datetime.now(UTC)).encode()
    assert read_import(archived, LIMITS).conversations == read.conversations
    for conversation in read.conversations if markdown else ():
        assert read_import(to_markdown(conversation).encode(), LIMITS).conversations == [conversation]


@given(files)
@example(as_json({"format": "vllm-chat-archive", "version": 1, "conversations": [
    {"title": "t" * 199 + " x", "messages": [{"role": "user", "content": "\r\nhi\r"}]}]}))  # fmt: skip
@example(b"<!-- vllm-chat-export version=1 -->\n# a\r\n<!-- message role=user -->\n\\<!-- message x\r")
@example(as_json([{"mapping": {"a": {"parent": "a"}}, "current_node": ["a"]}]))
def test_a_file_is_refused_plainly_or_kept_within_the_caps_and_round_trips(data: bytes) -> None:
    read = read_or_refusal(data)
    if isinstance(read, str):
        return
    assert_within_caps(read)
    assert_round_trips(read, markdown=data.lstrip(b"\xef\xbb\xbf").startswith(HEADER.encode()))


@given(st.lists(st.lists(texts, min_size=1, max_size=5), min_size=1, max_size=LIMITS.max_conversations))
def test_empty_messages_are_left_out_and_never_count_against_the_caps(conversations: list[list[str]]) -> None:
    """However many empty messages a file holds, only the others are kept and counted, and a file is
    refused only for a cap the kept ones pass."""
    listed = [{"messages": [{"role": "user", "content": said} for said in texts]} for texts in conversations]
    read = read_or_refusal(as_json({"format": "vllm-chat-archive", "version": 1, "conversations": listed}))
    kept = [[storable(said) for said in texts if said.strip()] for texts in conversations]
    kept = [texts for texts in kept if texts]
    stored_bytes = sum(len(TITLE) + sum(len(said.encode()) for said in texts) for texts in kept)
    if any(len(said) > LIMITS.max_message_chars for texts in conversations for said in texts):
        assert isinstance(read, str) and "longer than" in read
    elif not kept:
        assert read == "The file holds no message to import (empty messages are left out)."
    elif sum(map(len, kept)) > LIMITS.max_stored_messages:
        assert isinstance(read, str) and f"holds {sum(map(len, kept))} messages" in read
    elif stored_bytes > LIMITS.max_stored_bytes:
        assert isinstance(read, str) and f"holds {stored_bytes} bytes of text" in read
    else:
        assert isinstance(read, ImportRead), read
        assert [[m.content for m in c.messages] for c in read.conversations] == kept
        assert read.empty_messages == sum(map(len, conversations)) - sum(map(len, kept))
        assert read.empty_conversations == len(conversations) - len(kept)


Said = tuple[str, str, Any]  # (role, text, time) of one message
well_formed = st.lists(
    st.tuples(
        texts,
        st.lists(st.tuples(st.sampled_from(["user", "assistant"]), texts, times), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=LIMITS.max_conversations,
)
CAPS = ("is longer than", "holds no message to import", "messages, and one import", "bytes of text, and one")


def written_as(format_name: str, conversations: list[tuple[str, list[Said]]]) -> bytes:
    """The conversations as a file of the format, the way the app or ChatGPT writes it."""
    if format_name == "markdown":
        title, said = conversations[0]
        messages = [Message(role, storable(text), None) for role, text, _ in said]
        return to_markdown(Conversation(storable(title), None, messages)).encode()
    if format_name == "archive":
        listed = [
            {
                "title": title,
                "messages": [{"role": r, "content": text, "created_at": at} for r, text, at in said],
            }
            for title, said in conversations
        ]
        return as_json({"format": "vllm-chat-archive", "version": 1, "conversations": listed})
    exported = []
    for title, said in conversations:  # a chain from the root: the branch ChatGPT shows
        mapping: dict[str, Any] = {"root": {"message": None, "parent": None, "children": []}}
        for index, (role, text, at) in enumerate(said):
            content = {"content_type": "text", "parts": [text]}
            message = {"author": {"role": role}, "create_time": at, "content": content}
            parent = f"n{index - 1}" if index else "root"
            mapping[f"n{index}"] = {"message": message, "parent": parent, "children": []}
        exported.append({"title": title, "mapping": mapping, "current_node": f"n{len(said) - 1}"})
    return as_json(exported)


@given(well_formed, st.sampled_from(["archive", "chatgpt", "markdown"]))
def test_every_message_with_text_is_kept_in_order_and_round_trips(
    conversations: list[tuple[str, list[Said]]], format_name: str
) -> None:
    if format_name == "markdown":
        conversations = conversations[:1]  # one conversation a file
    read = read_or_refusal(written_as(format_name, conversations))
    if isinstance(read, str):
        assert any(cap in read for cap in CAPS), read
        return
    line_ends = (
        (lambda text: text.replace("\r\n", "\n").replace("\r", "\n")) if format_name == "markdown" else str
    )
    expected = [
        [(role, storable(line_ends(text))) for role, text, _ in said if text.strip()]
        for _, said in conversations
    ]
    assert [[(m.role, m.content) for m in c.messages] for c in read.conversations] == [
        e for e in expected if e
    ]
    assert_within_caps(read)
    assert_round_trips(read, markdown=format_name == "markdown")
