"""Read forgelog's log outside forgelog, with fastavro and the `.avsc` files.

Every message value on every forgelog topic is one event in Avro single-object
encoding: the bytes C3 01, the 8-byte CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form (little-endian), then the Avro binary body.
`Registry` knows today's schemas (`avro/*.avsc`) and every earlier version
(`avro/history/vN/*.avsc`), and reads any event into today's shape (fields
added since its writer's version get their defaults):

    from forgelog_avro import Registry
    registry = Registry("schemas/avro")
    kind, record = registry.decode(message.value())   # e.g. a confluent_kafka message

Events recorded before forgelog wrote the specification's fingerprints (its
Avro library put `{"type": "long"}` for `timestamp-millis` fields in the
canonical form) carry the fingerprints listed in
`avro/legacy-fingerprints.json`; the registry reads those too.

Packed per-token arrays (`prompt_token_ids`, `completion_token_ids`,
`completion_logprobs`, ...) are `bytes` of little-endian u32 or f32 words:
`unpack_u32` and `unpack_f32` turn them into lists. Calls may be stored as
what is new since an earlier call of their session (`*_splice` fields, schema
v5): see schemas/README.md.

An event too large for one record of the log is a claim check: a record of
kind `EventClaim` (`avro/EventClaim.avsc`) whose `url` holds the event's
bytes (file://, s3://, ...); fetch them, check `sha256` and `size`, and
`decode` those bytes as the event.

Command line (needs only `pip install fastavro`):

    python forgelog_avro.py read EVENTS    # each event of a file of length-prefixed
                                           # events (little-endian u32 length, then
                                           # the event) as a JSON line {"type": kind,
                                           # ...record}, bytes as {"base64": ...}
    python forgelog_avro.py fingerprints   # {schema file: fingerprint} as JSON
"""

import base64
import io
import json
import pathlib
import struct
import sys

from fastavro import parse_schema, schemaless_reader
from fastavro.schema import fingerprint, to_parsing_canonical_form

MAGIC = b"\xc3\x01"


def spec_fingerprint(schema):
    """The CRC-64-AVRO fingerprint of a parsed schema, as the header's 8 bytes."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


class Registry:
    def __init__(self, avro_dir):
        root = pathlib.Path(avro_dir)
        self.current = {}
        self.writers = {}
        by_file = {}
        for path in sorted(root.glob("*.avsc")):
            schema = parse_schema(json.loads(path.read_text()))
            self.current[path.stem] = schema
            by_file[path.relative_to(root).as_posix()] = (path.stem, schema)
        for path in sorted(root.glob("history/v*/*.avsc")):
            schema = parse_schema(json.loads(path.read_text()))
            by_file[path.relative_to(root).as_posix()] = (path.stem, schema)
        for kind, schema in by_file.values():
            self.writers[spec_fingerprint(schema)] = (kind, schema)
        legacy = root / "legacy-fingerprints.json"
        if legacy.exists():
            for hex_fp, file in json.loads(legacy.read_text()).items():
                self.writers[bytes.fromhex(hex_fp)] = by_file[file]

    def decode(self, value):
        """(kind, record) of one event; ValueError for anything else."""
        if value[:2] != MAGIC or len(value) < 10:
            raise ValueError(f"not a forgelog event: {len(value)} bytes without the C3 01 header")
        found = self.writers.get(bytes(value[2:10]))
        if found is None:
            raise ValueError(f"unknown schema fingerprint {value[2:10].hex()}")
        kind, writer = found
        body = io.BytesIO(value[10:])
        record = schemaless_reader(body, writer, self.current[kind])
        if body.read(1):
            raise ValueError(f"corrupt {kind}: bytes left after the record")
        return kind, record


def unpack_u32(packed):
    return list(struct.unpack(f"<{len(packed) // 4}I", packed))


def unpack_f32(packed):
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))


def _jsonable(v):
    if isinstance(v, bytes):
        return {"base64": base64.b64encode(v).decode()}
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if hasattr(v, "timestamp"):  # timestamp-millis fields read as datetimes
        return round(v.timestamp() * 1000)
    return v


def read_file(path):
    data = pathlib.Path(path).read_bytes()
    at = 0
    while at < len(data):
        (n,) = struct.unpack_from("<I", data, at)
        yield data[at + 4 : at + 4 + n]
        at += 4 + n


AVRO_DIR = pathlib.Path(__file__).resolve().parent.parent / "avro"


def main():
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "read" and len(sys.argv) == 3:
        registry = Registry(AVRO_DIR)
        for value in read_file(sys.argv[2]):
            kind, record = registry.decode(value)
            print(json.dumps({"type": kind, **_jsonable(record)}))
    elif command == "fingerprints":
        files = sorted(AVRO_DIR.glob("*.avsc")) + sorted(AVRO_DIR.glob("history/v*/*.avsc"))
        print(json.dumps({
            f.relative_to(AVRO_DIR).as_posix(): spec_fingerprint(parse_schema(json.loads(f.read_text()))).hex()
            for f in files
        }))
    else:
        sys.exit("usage: forgelog_avro.py read EVENTS | fingerprints")


if __name__ == "__main__":
    main()
