"""The gateway room: sessions over the wire (above runtime/, never Streamlit).

    protocol.py          the Realtime events (GA, beta aliases), session settings, limits
    client_events.py     one connection's client events → what the sender sends
    responses.py         a frame-synchronous session framed as Realtime responses
    outbox.py            one connection's outgoing events (bounded) and the thread courier
    server.py            the /v1/realtime WebSocket endpoint (Starlette)
    door.py              the token beyond loopback (ASGI middleware)
    store_api.py         the holder's read endpoint, /api/store/sql
    mic.py               the operator's microphone page, /mic (its files in static/)
    serve.py             `metronome serve`: one run whose sessions are clients, under uvicorn
    client.py            `metronome load`: N paced sessions against any realtime server
    client_protocols.py  the load client's dialects: openai (GA), openai-beta, vllm
    client_record.py     the client's per-frame truth, recorded as a run
    speech.py            the client's audio: synthetic speech or a WAV folder
"""
