"""redact(): credentials out of any text ckptfs shows (messages, logs, status, metrics).

A store's own URL never holds a secret (the stores keep credentials out of it); this is
the last line, applied to whatever may quote an endpoint, a URL or a connection string
that came from the user or an SDK: the password of a URL (user:password@host), query
parameters that are credentials (a SAS token's sig, a presigned URL's signature,
token=, password=, key=, ...) and the secret fields of a connection string (AccountKey=,
SharedAccessSignature=, ...) are replaced with REDACTED.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

T = TypeVar("T")

#: what a secret is replaced with
MASK = "REDACTED"

#: query parameters whose value is a credential (any case): an Azure SAS token's
#: signature, an S3 or GCS presigned URL's signature, credential and session token, and
#: the usual names of tokens, keys and passwords
SECRET_PARAMS = (
    "sig", "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential", "awsaccesskeyid", "access_token", "token",
    "sas", "sas_token", "password", "passwd", "pwd", "secret", "client_secret", "key",
    "api_key", "apikey", "account_key", "accountkey",
)
#: the fields of a connection string (Name=value;...) whose value is a secret (any case)
SECRET_FIELDS = (
    "AccountKey", "SharedAccessSignature", "SharedAccessKey",
    "Password", "Pwd", "ClientSecret", "SecretKey", "SecretAccessKey", "AccessKey",
)

# scheme://user:password@host (the password may hold an unescaped '@': up to the last
# '@' before the path); scheme://token@host (a lone user may be a token)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:?#'\"]*)"
                       r"(?::(?P<password>[^\s/?#'\"]*))?@")
# the end of a value: what cannot be in a token, a key or a signature as written in a URL
_END = r"&\s#\"'\\<>;,)\]}"
_PARAM = re.compile(
    rf"(?P<lead>(?:^|[?&;]))(?P<name>{'|'.join(map(re.escape, SECRET_PARAMS))})"
    rf"=(?P<value>[^{_END}]*?)(?=:?(?:[{_END}]|$))", re.IGNORECASE)
_FIELD = re.compile(
    rf"(?P<lead>(?:^|[;\s\"'{{,(]))(?P<name>{'|'.join(map(re.escape, SECRET_FIELDS))})"
    rf"=(?P<value>[^;\s\"'\\]*)", re.IGNORECASE)


def _userinfo(m: re.Match[str]) -> str:
    if m.group("password") is not None:
        return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
    return f"{m.group('scheme')}{MASK}@" if m.group("user") else m.group(0)


def _value(m: re.Match[str]) -> str:
    return f"{m.group('lead')}{m.group('name')}={MASK}" if m.group("value") else m.group(0)


def redact(text: object) -> str:
    """`text` (str() of it) with every credential in it replaced with MASK."""
    out = str(text)
    if "=" not in out and "@" not in out:  # the common case: nothing to look for
        return out
    out = _USERINFO.sub(_userinfo, out)
    out = _FIELD.sub(_value, out)
    return _PARAM.sub(_value, out)


def redacted(value: T) -> T:
    """A JSON-like value (dicts, lists, strings, numbers) with every string in it
    redacted (the keys of dicts too)."""
    out: Any
    if isinstance(value, str):
        out = redact(value)
    elif isinstance(value, dict):
        out = {redacted(k): redacted(v) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        out = type(value)(redacted(v) for v in value)
    else:
        out = value
    return out  # type: ignore[no-any-return]
