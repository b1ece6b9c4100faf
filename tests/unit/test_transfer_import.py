"""The import readers against hostile and odd files: every bad file is refused with a clear message
(BadImport) and nothing half-read comes out; ChatGPT's export gives only the shown branch."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from services.accounts.store import AccountStore
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate
from services.transfer.archive import BadImport, Conversation, ImportLimits, Message, archive_text
from services.transfer.markdown import to_markdown
from services.transfer.reading import read_conversations
from services.transfer.service import Transfers
from services.web import transfer_chat

LIMITS = ImportLimits(
    max_conversations=5, max_messages=6, max_message_chars=1000, max_stored_messages=20,
    max_stored_bytes=10_000, max_depth=16,
)  # fmt: skip


def node(key: str, role: str | None, text: str | None, parent: str | None, children: list[str]) -> dict:
    message = None
    if role is not None:
        message = {"id": key, "author": {"role": role}, "create_time": 1_700_000_000,
                   "content": {"content_type": "text", "parts": [text]}}  # fmt: skip
    return {"id": key, "message": message, "parent": parent, "children": children}


def chatgpt(mapping: dict, current: str | None, title: str = "From ChatGPT") -> bytes:
    return json.dumps([{"title": title, "create_time": 1_700_000_000.5, "mapping": mapping,
                        "current_node": current}]).encode()  # fmt: skip


def branched() -> dict:
    """root -> system -> q1 -> (a1 old | a1 new) -> q2 on the new answer only."""
    return {
        "root": node("root", None, None, None, ["sys"]),
        "sys": node("sys", "system", "You are ChatGPT", "root", ["q1"]),
        "q1": node("q1", "user", "First question", "sys", ["a-old", "a-new"]),
        "a-old": node("a-old", "assistant", "Old answer", "q1", []),
        "a-new": node("a-new", "assistant", "New answer", "q1", ["q2"]),
        "q2": node("q2", "user", "Second question", "a-new", []),
    }


def test_chatgpt_export_gives_only_the_current_branch() -> None:
    [conversation] = read_conversations(chatgpt(branched(), "q2"), LIMITS)
    assert conversation.title == "From ChatGPT"
    assert [(m.role, m.content) for m in conversation.messages] == [
        ("user", "First question"), ("assistant", "New answer"), ("user", "Second question"),
    ]  # fmt: skip
    assert conversation.messages[0].created_at == "2023-11-14T22:13:20.000Z"


def test_chatgpt_current_node_on_another_branch_is_followed() -> None:
    [conversation] = read_conversations(chatgpt(branched(), "a-old"), LIMITS)
    assert [m.content for m in conversation.messages] == ["First question", "Old answer"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["root"].update(parent="q2"), "cycle"),
        (lambda m: m["q2"].update(parent="q2"), "cycle"),
        (lambda m: m["q1"].update(parent="elsewhere"), "not in its"),
        (lambda m: m["q1"].update(parent=["sys"]), "not in its"),
        (lambda m: m["q1"].update(message="text"), "must be an object"),
        (lambda m: m["q1"]["message"]["content"].update(parts="a string"), "must be a list"),
        (lambda m: m["q1"]["message"]["content"].update(parts=["x" * 1001]), "longer than 1,000"),
    ],
)
def test_chatgpt_broken_trees_are_refused(change, message: str) -> None:
    mapping = branched()
    change(mapping)
    with pytest.raises(BadImport, match=message):
        read_conversations(chatgpt(mapping, "q2"), LIMITS)


def test_chatgpt_branch_longer_than_the_limit_is_refused_without_walking_it_all() -> None:
    mapping = {"n0": node("n0", "user", "hi", None, ["n1"])}
    for index in range(1, 50_000):
        mapping[f"n{index}"] = node(f"n{index}", "user", "hi", f"n{index - 1}", [])
    with pytest.raises(BadImport, match="more than 6 messages"):
        read_conversations(chatgpt(mapping, "n49999"), LIMITS)


def test_chatgpt_tool_messages_are_skipped() -> None:
    mapping = branched()
    mapping["a-new"]["message"]["author"]["role"] = "tool"
    [conversation] = read_conversations(chatgpt(mapping, "q2"), LIMITS)
    assert [m.content for m in conversation.messages] == ["First question", "Second question"]


IMAGE = {"content_type": "image_asset_pointer", "asset_pointer": "file-service://file-1", "width": 800}


def test_chatgpt_words_beside_an_image_are_kept_with_a_note_of_what_was_left_out() -> None:
    mapping = branched()
    mapping["q2"]["message"]["content"] = {
        "content_type": "multimodal_text",
        "parts": [IMAGE, "What is in this picture?", IMAGE, {"content_type": "something_new"}],
    }
    [conversation] = read_conversations(chatgpt(mapping, "q2"), LIMITS)
    assert conversation.messages[-1].content == (
        "What is in this picture?\n\n[2 images and 1 attachment not imported]"
    )


def test_chatgpt_a_message_of_only_an_image_says_so() -> None:
    mapping = branched()
    mapping["q2"]["message"]["content"] = {"content_type": "multimodal_text", "parts": [IMAGE]}
    [conversation] = read_conversations(chatgpt(mapping, "q2"), LIMITS)
    assert conversation.messages[-1].content == "[1 image not imported]"


def test_chatgpt_voice_messages_keep_their_transcript() -> None:
    mapping = branched()
    mapping["q2"]["message"]["content"] = {"content_type": "multimodal_text", "parts": [
        {"content_type": "audio_transcription", "text": "Tell me a joke", "direction": "in"},
        {"content_type": "audio_asset_pointer", "asset_pointer": "sediment://file-2"},
    ]}  # fmt: skip
    [conversation] = read_conversations(chatgpt(mapping, "q2"), LIMITS)
    assert conversation.messages[-1].content == "Tell me a joke\n\n[1 voice recording not imported]"


CODE = "print('`a```')\n"


def test_chatgpt_code_the_assistant_ran_is_kept_as_a_block_and_tool_traffic_is_not() -> None:
    """Code sent to python is what the person saw the assistant write; its output, a browsing call
    and quote, an image prompt, custom instructions and hidden messages are not the conversation."""
    said = [
        ("user", {"content_type": "user_editable_context", "user_profile": "I am Ann"}, "all", True),
        ("assistant", {"content_type": "code", "language": "python", "text": CODE}, "python", False),
        ("tool", {"content_type": "execution_output", "text": "`a```"}, "all", False),
        ("assistant", {"content_type": "code", "language": "unknown", "text": "search(1)"}, "web", False),
        ("tool", {"content_type": "tether_quote", "title": "x", "text": "quoted"}, "all", False),
        ("assistant", {"content_type": "text", "parts": ['{"prompt": "a cat"}']}, "dalle.text2im", False),
        ("assistant", {"content_type": "thoughts", "thoughts": [{"content": "hmm"}]}, "all", False),
        ("assistant", {"content_type": "text", "parts": ["It printed it."]}, "all", False),
    ]
    mapping = {"q": node("q", "user", "Run it", None, [])}
    for index, (role, content, recipient, hidden) in enumerate(said):
        parent = f"n{index - 1}" if index else "q"
        mapping[f"n{index}"] = node(f"n{index}", role, None, parent, [])
        message = mapping[f"n{index}"]["message"]
        message.update(content=content, recipient=recipient)
        if hidden:
            message["metadata"] = {"is_visually_hidden_from_conversation": True}
    [conversation] = read_conversations(chatgpt(mapping, f"n{len(said) - 1}"), LIMITS)
    assert [m.content for m in conversation.messages] == [
        "Run it", "````python\nprint('`a```')\n````", "It printed it.",
    ]  # fmt: skip


def test_ids_in_the_file_are_never_part_of_what_is_read() -> None:
    victim = "0f8c1d2e-0000-4000-8000-000000000001"
    mapping = {victim: node(victim, "user", "hello", None, [])}
    mapping[victim]["message"]["id"] = victim
    conversations = read_conversations(chatgpt(mapping, victim), LIMITS)
    assert victim not in repr(conversations)


def archive(conversations: list) -> bytes:
    return json.dumps({"format": "vllm-chat-archive", "version": 1, "conversations": conversations}).encode()


def test_the_apps_archive_and_markdown_round_trip() -> None:
    tricky = "Hi\n<!-- message role=assistant -->\n\\<!-- message role=user -->"
    at = "2026-12-01T10:00:00.000Z"
    original = Conversation("Plans «today»", at, [
        Message("user", tricky, at), Message("assistant", "# Not a title\n\n**You**\n", None),
    ])  # fmt: skip
    from_json = read_conversations(archive_text([original], datetime.now(UTC)).encode(), LIMITS)
    from_markdown = read_conversations(to_markdown(original).encode(), LIMITS)
    for [conversation] in (from_json, from_markdown):
        assert conversation.title == original.title
        assert conversation.messages == original.messages


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"not json at all", "not JSON"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b"[]", "no conversation"),
        (b'{"some": "object"}', "not this app's"),
        (b"[1, 2, 3]", "not this app's"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper"),
        (b"[" * 20 + b"]" * 20, "nested deeper than 16"),
        (json.dumps({"format": "vllm-chat-archive", "version": 99, "conversations": []}).encode(), "version"),
        (json.dumps({"format": "vllm-chat-archive", "version": 1, "conversations": {}}).encode(), "a list"),
        (archive([]), "no conversation"),
        (archive(["x"]), "must be an object"),
        (archive([{"messages": "x"}]), "must be an object with a list"),
        (archive([{"messages": [{"role": "system", "content": "x"}]}]), "role"),
        (archive([{"messages": [{"role": "user", "content": 5}]}]), "must be text"),
        (archive([{"messages": [{"role": "user", "content": ["x"]}]}]), "must be text"),
        (archive([{"messages": [{"role": "user", "content": "x" * 1001}]}]), "longer than 1,000"),
        (archive([{"messages": [{"role": "user", "content": "x"}] * 7}]), "more than 6 messages"),
        (archive([{"messages": []}] * 6), "more than 5 conversations"),
    ],
)
def test_bad_files_are_refused_with_a_clear_message(data: bytes, message: str) -> None:
    with pytest.raises(BadImport, match=message):
        read_conversations(data, LIMITS)


def test_wrong_types_in_optional_fields_are_dropped_not_trusted() -> None:
    [conversation] = read_conversations(
        archive([{"title": {"$ne": 1}, "created_at": 1e308, "messages": [
            {"role": "user", "content": "hi", "created_at": "not a time"},
            {"role": "assistant", "content": "yo", "created_at": [1]},
        ]}]), LIMITS,
    )  # fmt: skip
    assert conversation.title == "Imported conversation" and conversation.created_at is None
    assert [m.created_at for m in conversation.messages] == [None, None]


def test_a_huge_title_is_cut() -> None:
    said = [{"role": "user", "content": "hi"}]
    [conversation] = read_conversations(archive([{"title": "t" * 100_000, "messages": said}]), LIMITS)
    assert len(conversation.title) == 200


def test_markdown_with_too_many_messages_is_refused() -> None:
    text = to_markdown(Conversation("x", None, [Message("user", "hi")] * 7))
    with pytest.raises(BadImport, match="more than 6 messages"):
        read_conversations(text.encode(), LIMITS)


GOOD = {"title": "good", "messages": [{"role": "user", "content": "fine"}]}
BAD = {"title": "bad", "messages": [{"role": "user", "content": 7}]}
# tests/system/transfer/test_export_import.py's bad files (its server keeps the first and the sizes)
SERVER_BAD_FILES = {
    "bad last conversation": (
        json.dumps(
            {"format": "vllm-chat-archive", "version": 1, "conversations": [GOOD, GOOD, BAD]}
        ).encode(),
        "Conversation 3, message 1: the content must be text",
    ),
    "nested past the parser": (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    "an image": (b"\x89PNG\r\n\x1a\n not a conversation", "not JSON"),
    "empty": (b"", "empty"),
    "a cycle": (
        json.dumps([{"mapping": {"a": {"parent": "b"}, "b": {"parent": "a"}}, "current_node": "a"}]).encode(),
        "cycle",
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize(("data", "words"), SERVER_BAD_FILES.values(), ids=SERVER_BAD_FILES.keys())
async def test_the_servers_bad_files_are_refused_before_anything_is_stored(
    data: bytes, words: str, tmp_path: Path
) -> None:
    """What the import route calls (`Transfers.import_file`, with the default import limits, on a real
    SQLite database): the file is refused with its message, and no conversation is stored."""
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    engine = create_engine(settings)
    await migrate(engine)
    try:
        await AccountStore(engine).add("bob", "bobs-password-1")
        with pytest.raises(BadImport) as refused:
            await Transfers(engine, settings).import_file("bob", data, "Assistant")
        assert words in str(refused.value)
        async with engine.connect() as connection:
            stored = await connection.execute(text("SELECT COUNT(*) FROM threads"))
            assert stored.scalar_one() == 0
    finally:
        await engine.dispose()


# JSON may carry what UTF-8 cannot: a lone surrogate; and NUL, which PostgreSQL's text refuses.
UNSTORABLE_TITLE = "Notes \ud800 end\x00"
UNSTORABLE_TEXT = "hi \udfff there\x00"


@pytest.mark.parametrize("format_name", ["archive", "chatgpt"])
def test_text_the_database_cannot_keep_becomes_the_replacement_character(format_name: str) -> None:
    if format_name == "archive":
        data = archive(
            [{"title": UNSTORABLE_TITLE, "messages": [{"role": "user", "content": UNSTORABLE_TEXT}]}]
        )
    else:
        mapping = {"q": node("q", "user", UNSTORABLE_TEXT, None, [])}
        data = chatgpt(mapping, "q", title=UNSTORABLE_TITLE)
    assert b"\\ud800" in data and b"\\u0000" in data, "the file carries them as JSON escapes"
    [conversation] = read_conversations(data, LIMITS)
    assert conversation.title == "Notes \ufffd end\ufffd"
    assert conversation.messages[0].content == "hi \ufffd there\ufffd"
    conversation.title.encode("utf-8")  # what the database's driver does first


@pytest.mark.parametrize(
    "at", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999999-00:01"]
)
def test_a_time_past_what_python_can_hold_once_in_utc_is_dropped(at: str) -> None:
    [conversation] = read_conversations(
        archive([{"created_at": at, "messages": [{"role": "user", "content": "hi", "created_at": at}]}]),
        LIMITS,
    )
    assert conversation.created_at is None and conversation.messages[0].created_at is None
    [from_chatgpt] = read_conversations(chatgpt({"q": node("q", "user", "hi", None, [])}, "q"), LIMITS)
    assert from_chatgpt.created_at == "2023-11-14T22:13:20.500Z", "ordinary times are kept"


@pytest.mark.asyncio
async def test_a_file_of_surrogates_nul_and_extreme_times_is_stored_and_exported(tmp_path: Path) -> None:
    """What the import route and /import call, on a real SQLite database: the file used to fail in the
    database driver (a 500 and a traceback)."""
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    engine = create_engine(settings)
    await migrate(engine)
    try:
        await AccountStore(engine).add("bob", "bobs-password-1")
        transfers = Transfers(engine, settings)
        data = archive([{"title": UNSTORABLE_TITLE, "created_at": "9999-12-31T23:59:59-14:00",
                         "messages": [{"role": "user", "content": UNSTORABLE_TEXT,
                                       "created_at": "0001-01-01T00:00:00+14:00"}]}])  # fmt: skip
        imported = await transfers.import_file("bob", data, "Assistant")
        assert imported.titles == ["Notes \ufffd end\ufffd"]
        exported = await transfers.export_one(imported.thread_ids[0], "bob", "json")
        assert (
            exported is not None
            and "hi \ufffd there\ufffd"
            in json.loads(exported.text)["conversations"][0]["messages"][0]["content"]
        )
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_the_chats_import_tells_a_failure_in_a_sentence_not_the_exceptions_text(tmp_path: Path) -> None:
    class Failing:
        async def import_file(self, owner: str, data: bytes, assistant_name: str) -> None:
            raise RuntimeError("database exploded at /srv/secret/chat.db")

    upload = tmp_path / "upload"
    upload.write_bytes(archive([GOOD]))
    runtime = SimpleNamespace(transfers=Failing(), settings=Settings.from_env({}))
    said = await transfer_chat._import(runtime, "bob", [(str(upload), "mine.json")])  # type: ignore[arg-type]
    assert "«mine.json» could not be imported right now (nothing was stored)" in said
    assert "exploded" not in said and "/srv" not in said and "RuntimeError" not in said
    gone = await transfer_chat._import(runtime, "bob", [(str(tmp_path / "gone"), "gone.json")])  # type: ignore[arg-type]
    assert "could not be imported right now" in gone, "a file removed meanwhile"
