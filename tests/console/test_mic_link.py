"""The Load page's link to a running `metronome serve`'s microphone page."""

from __future__ import annotations

import pytest

from console.mic_link import GATEWAY_URL_ENV, mic_page_url
from tests.console.conftest import page


@pytest.mark.parametrize("address, url", [
    ("ws://127.0.0.1:8765/v1/realtime", "http://127.0.0.1:8765/mic"),  # what serve prints
    ("wss://gw.example:443/v1/realtime", "https://gw.example:443/mic"),
    ("http://localhost:9000/", "http://localhost:9000/mic"),
    ("  gpu-host:8765 ", "http://gpu-host:8765/mic"),
    ("HTTP://[::1]:8765", "http://[::1]:8765/mic"),
])
def test_an_address_becomes_the_mic_page_of_that_server(address, url):
    assert mic_page_url(address) == url


@pytest.mark.parametrize("address, says", [
    ("", "running `metronome serve`"), ("ftp://host:21", "ftp:// is not"),
    ("http://host:99999", "no valid port"), ("http://:8765", "names no host"),
])
def test_a_bad_address_says_what_is_wrong(address, says):
    with pytest.raises(ValueError, match=says):
        mic_page_url(address)


def test_load_page_links_to_its_own_mic_page_and_to_the_gateway_in_the_environment(
        db, monkeypatch):
    monkeypatch.setenv(GATEWAY_URL_ENV, "ws://10.0.0.7:8800/v1/realtime")
    at = page("load")
    own, elsewhere = [b for b in at.get("link_button")]
    assert own.proto.url == "/mic"  # the console serves it, on its own origin
    assert elsewhere.proto.url == "http://10.0.0.7:8800/mic"
    at.text_input(key="gateway_url").input("nonsense://x").run()
    assert [b.proto.url for b in at.get("link_button")] == ["/mic"]
    assert "nonsense:// is not" in at.error[0].value
