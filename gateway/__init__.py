"""The gateway room: sessions over the wire (above runtime/, never Streamlit).

    protocol.py       the Realtime event subset and the per-connection limits
    server.py         the /v1/realtime WebSocket endpoint (Starlette)
    mic.py            the operator's microphone page, /mic (its files in static/)
    serve.py          `metronome serve`: one run whose sessions are clients, under uvicorn
    client.py         `metronome load`: N paced sessions against any such server
    client_record.py  the client's per-frame truth, recorded as a run
    speech.py         the client's audio: synthetic speech or a WAV folder
"""
