"""The worker's end of the link without processes: a connection's audio goes down a real
socket as its frames' token ids (the same as one process cuts), and a client ahead of what
the run has recorded is refused as in one process."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from gateway.link import Wire, read_items
from gateway.worker import WorkerFrames
from load_gen.remote import AudioCutter, BufferFull, RemoteFrames
from load_gen.tokenizer import FrameTokenizer

TOK = FrameTokenizer(16_000, 80.0, 16, 2048)


def test_worker_frames_go_down_the_link_as_one_process_cuts_them_and_are_bounded():
    async def main():
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_unix_connection(sock=ours)
        reader, _ = await asyncio.open_unix_connection(sock=theirs)
        frames = WorkerFrames(Wire(asyncio.get_running_loop(), writer), 7, AudioCutter(TOK),
                              max_buffer_s=0.5, audio=False)
        frames.set_rate(24_000)
        rng = np.random.default_rng(1)
        audio = (rng.standard_normal(1920 * 6) * 0.1).astype(np.float32)
        for i in range(0, len(audio), 960):
            frames.append(audio[i:i + 960])
        # 6 frames unrecorded, one of them in flight: 5 count, and 0.5 s allows 6.25
        with pytest.raises(BufferFull, match="0.5 s allowed"):
            frames.append(audio[:1920 * 2])
        frames.recorded = 3  # rows of frames 0-3 came back: room again
        frames.append(audio[:1920])
        got = []
        while sum(len(item[2]) for item in got) < 7:
            got += [item for item in await read_items(reader) if item[0] == "frames"]
        writer.close()
        return got

    got = asyncio.run(main())
    assert {item[1] for item in got} == {7}
    sent = [ids for item in got for ids, _voice, audio in item[2] if audio is None]
    one = RemoteFrames(TOK, max_buffer_s=2.0)
    one.set_rate(24_000)
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(1920 * 6) * 0.1).astype(np.float32)
    one.append(audio)
    one.append(audio[:1920])
    assert sent == [one.next_frame(0.08).token_ids for _ in range(7)]


def test_the_workers_port_sends_without_nagle():
    from gateway.worker import listening_socket

    listener = listening_socket("127.0.0.1", 0)
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()

    async def transport_nodelay():
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            asyncio.Protocol, accepted)
        on = transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                           socket.TCP_NODELAY)
        transport.close()
        return on

    try:
        assert asyncio.run(transport_nodelay())  # what uvicorn's transports get from asyncio
    finally:
        client.close()
        listener.close()
