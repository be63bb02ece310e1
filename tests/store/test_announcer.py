"""The announcer's puts into the outcomes bucket, on a real nats-server: a put made again
never overwrites what the key holds by then, and closing waits for every put's answer.
(That a refused put is made again until stored: `test_intake.py`.)"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.client import Client as Connection
from structlog.testing import capture_logs

from controlplane import announcer as announcer_module
from controlplane.announcer import Announcer
from events.jetstream.streams import ensure_all
from events.language.messages import Outcome, outcome_key
from events.language.subjects import Layout

KEY = outcome_key("user:dana", "c1")
TOLD = Outcome(command_id="c1", accepted=True, sequences=[7])
"""What the writer announced first: its lone event's outcome."""
RECORDED = Outcome(command_id="c1", accepted=False, reason="recorded first")
"""What the command's marker records: another writer's outcome, stored first."""


@pytest.fixture
async def layout(nc: Connection, prefix: str) -> Layout:
    layout = Layout(prefix)
    await ensure_all(nc.jetstream(), layout)
    return layout


async def until(condition: object, what: str) -> None:
    """A condition wait (at most 20 s): `condition` is a callable."""
    assert callable(condition)
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.05)  # poll interval of a condition wait, not synchronisation
    raise AssertionError(what)


async def test_a_put_made_again_never_overwrites_a_newer_outcome(
        nc: Connection, layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first put finds no bucket; before it is made again, the key is stored with the
    outcome the marker records. The put made again leaves that value: the bucket and the
    log agree."""
    js = nc.jetstream()
    resume = asyncio.Event()

    async def paused(_stop: asyncio.Event, _seconds: float) -> None:
        await resume.wait()  # the pause between puts ends when the test says

    monkeypatch.setattr(announcer_module, "pause_unless_stopped", paused)
    await js.delete_stream(f"KV_{layout.outcomes_bucket}")
    announcer = Announcer(nc, layout)
    await announcer.announce(KEY, TOLD)
    await until(lambda: announcer.puts_failed == 1, "the first put was never refused")
    await ensure_all(js, layout)  # the bucket back, empty
    kv = await js.key_value(layout.outcomes_bucket)
    await kv.put(KEY, msgspec.msgpack.encode(RECORDED))
    resume.set()
    await asyncio.gather(*announcer._again)
    entry = await kv.get(KEY)
    assert entry.value is not None
    assert msgspec.msgpack.decode(entry.value, type=Outcome) == RECORDED
    assert announcer.puts_failed == 1, "a key found stored is no failure"
    await announcer.close()


async def test_closing_waits_for_the_answer_to_every_put_sent(
        nc: Connection, layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put is sent and the bucket does not answer (something hears the subject, nothing
    stores it). Closing waits for the answer, here its timeout, and says the outcome was
    not stored, once, as an error: the command was acked when the put was sent, and
    nothing will put it again."""
    monkeypatch.setattr(announcer_module, "OUTCOME_PUT_TIMEOUT_SECONDS", 0.5)
    await nc.jetstream().delete_stream(f"KV_{layout.outcomes_bucket}")
    silent = await nc.subscribe(f"$KV.{layout.outcomes_bucket}.>")  # hears, never answers
    announcer = Announcer(nc, layout)
    with capture_logs() as logs:
        await announcer.announce(KEY, TOLD)
        await announcer.close()
    await silent.unsubscribe()
    assert announcer.puts_failed == 1, "closed before the put's answer came"
    said = [(entry["log_level"], entry["event"]) for entry in logs]
    assert said == [("error", "the outcomes bucket did not store an outcome; "
                              "its marker is the record")]
