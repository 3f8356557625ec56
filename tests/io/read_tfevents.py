"""Independent reader of TensorBoard event files for io_test.

Parses the TFRecord framing, checks both masked CRC32Cs with a bitwise CRC (no tables, nothing shared with the C++
code), decodes tensorflow.Event with a minimal protobuf parser and prints one JSON object per event. Floats are
printed as their IEEE bit patterns so the C++ side compares them exactly.

  read_tfevents.py FILE                 # this reader
  read_tfevents.py --tensorboard FILE   # TensorBoard's own loader (needs the tensorboard package)
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, pos):
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


def fields(buf):
    """Yields (field number, wire type, raw value) of a serialized message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = varint(buf, pos)
        elif wt == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wt == 2:
            n, pos = varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wt == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        yield num, wt, val
    if pos != len(buf):
        raise ValueError("message overruns its length")


def decode_event(data):
    ev = {"values": []}
    for num, wt, val in fields(data):
        if num == 1 and wt == 1:
            ev["wall_time_bits"] = struct.unpack("<Q", val)[0]
        elif num == 2 and wt == 0:
            ev["step"] = val - (1 << 64) if val >= (1 << 63) else val
        elif num == 3 and wt == 2:
            ev["file_version"] = val.decode()
        elif num == 5 and wt == 2:
            for snum, swt, sval in fields(val):
                assert snum == 1 and swt == 2, "Summary has only repeated Value value = 1"
                v = {}
                for vnum, vwt, vval in fields(sval):
                    if vnum == 1 and vwt == 2:
                        v["tag"] = vval.decode()
                    elif vnum == 2 and vwt == 5:
                        v["simple_value_bits"] = struct.unpack("<I", vval)[0]
                    else:
                        raise ValueError("unexpected Value field %d" % vnum)
                ev["values"].append(v)
        else:
            raise ValueError("unexpected Event field %d wire type %d" % (num, wt))
    return ev


def read_own(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError("truncated record header at %d" % pos)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if len_crc != masked(crc32c(header)):
            raise ValueError("length CRC mismatch at %d" % pos)
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise ValueError("truncated record at %d" % pos)
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if data_crc != masked(crc32c(body)):
            raise ValueError("data CRC mismatch at %d" % pos)
        print(json.dumps(decode_event(body)))
        pos += 16 + length


def read_tensorboard(path):
    from tensorboard.backend.event_processing import event_file_loader as efl
    loader = getattr(efl, "LegacyEventFileLoader", efl.EventFileLoader)(path)
    for e in loader.Load():
        ev = {"values": [], "step": e.step, "wall_time_bits": struct.unpack("<Q", struct.pack("<d", e.wall_time))[0]}
        if e.file_version:
            ev["file_version"] = e.file_version
        for v in e.summary.value:
            x = v.simple_value if v.HasField("simple_value") else v.tensor.float_val[0]
            ev["values"].append({"tag": v.tag, "simple_value_bits": struct.unpack("<I", struct.pack("<f", x))[0]})
        print(json.dumps(ev))


if __name__ == "__main__":
    if sys.argv[1] == "--tensorboard":
        read_tensorboard(sys.argv[2])
    else:
        read_own(sys.argv[1])
