"""redact(): every form a credential takes in a URL or a connection string is masked, and
what ckptfs says otherwise (store URLs, paths, options) is left as it is."""

from __future__ import annotations

import json

import pytest

from ckptfs.common.redact import redact, redacted

SAS = "sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&sig=Ab%2Bc%2Fd%3D"


@pytest.mark.parametrize(("text", "shown"), [
    # a password in a URL (an --endpoint-url), also with an unescaped '@' in it
    ("cannot connect to http://alice:s3cret@127.0.0.1:9000: Connection refused",
     "cannot connect to http://alice:REDACTED@127.0.0.1:9000: Connection refused"),
    ("invalid endpoint 'http://alice:p@ss@h:99999' (--endpoint-url)",
     "invalid endpoint 'http://alice:REDACTED@h:99999' (--endpoint-url)"),
    ("https://ghp_token123@host/x", "https://REDACTED@host/x"),
    # a SAS token in a URL: its signature
    (f"cannot connect to http://127.0.0.1:10000/acct/?{SAS}: Connection refused",
     "cannot connect to http://127.0.0.1:10000/acct/?sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&"
     "se=2030-01-01T00:00:00Z&sig=REDACTED: Connection refused"),
    (SAS, SAS.replace("sig=Ab%2Bc%2Fd%3D", "sig=REDACTED")),
    # connection strings: the key, the whole SAS
    ("DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=Eby8/K1S+Z==;"
     "BlobEndpoint=http://127.0.0.1:10000/acct;",
     "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=REDACTED;"
     "BlobEndpoint=http://127.0.0.1:10000/acct;"),
    (f"BlobEndpoint=http://h/acct;SharedAccessSignature={SAS}",
     "BlobEndpoint=http://h/acct;SharedAccessSignature=REDACTED"),
    # presigned S3 and GCS URLs, other credential parameters
    ("GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=ab12&x=1",
     "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&x=1"),
    ("https://storage.googleapis.com/b/o?X-Goog-Signature=ff00 (HTTP 403)",
     "https://storage.googleapis.com/b/o?X-Goog-Signature=REDACTED (HTTP 403)"),
    ("https://h/?token=t:1 and https://h/?password=pw&user=u",
     "https://h/?token=REDACTED and https://h/?password=REDACTED&user=u"),
])
def test_credentials_are_masked(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize("text", [
    "az://ckpt/run1/ at http://127.0.0.1:10000/devstoreaccount1",
    "s3://bucket/run7/ at http://127.0.0.1:8333",
    "/nvme/ckptfs/cache dir=/x user@example.com a=b",
    "ckptfs prune /mnt/ckpt --keep-last 3 --keep-pattern 'checkpoint-*'",
    "sorted(entries, key=len) in a traceback",
    "files/step-1000/model.pt%o: key too long",
])
def test_everything_else_is_left_as_it_is(text: str) -> None:
    assert redact(text) == text


def test_a_json_line_stays_json() -> None:
    line = json.dumps({"message": f"GET http://h/a?{SAS}\" quoted", "n": 1})
    assert json.loads(redact(line)) == {
        "message": f"GET http://h/a?{SAS.replace('Ab%2Bc%2Fd%3D', 'REDACTED')}\" quoted",
        "n": 1}


def test_every_string_of_a_status_is_redacted() -> None:
    st = {"store": f"az://c/ at http://h/acct?{SAS}", "errors": ["http://u:pw@h: refused"],
          "pid": 7, "files": [{"path": "a.bin", "size": 1}]}
    assert redacted(st) == {
        "store": f"az://c/ at http://h/acct?{SAS.replace('Ab%2Bc%2Fd%3D', 'REDACTED')}",
        "errors": ["http://u:REDACTED@h: refused"], "pid": 7,
        "files": [{"path": "a.bin", "size": 1}]}
