#!/usr/bin/env python3
"""Cut sglang-kernel and flashinfer-cubin wheels down to Hopper (sm_90/sm_90a), fixing RECORD.

sglang-kernel: drop sgl_kernel/sm100/ (load_utils.py picks sgl_kernel/sm90/common_ops when the
GPU's compute capability is 90; load_utils.py is patched to use sm90/ for any other capability
or no GPU) and, inside every remaining .so, compact each CUDA fatbin to its
sm_90 entries (cubins for sm_80/86/89/100/103/120 removed, the freed bytes zeroed, file size and
ELF layout unchanged). A fatbin with no sm_90 cubin is left whole.
flashinfer-cubin: drop every .cubin whose ELF arch is not sm_90 (0.6.12 ships only sm_100/103
ones), keep the arch-independent files (headers, checksums, Python).
Usage: cut_wheels.py WHEEL_DIR
"""
import base64
import glob
import hashlib
import os
import struct
import sys
import zipfile

KEEP_ARCH = 90
FATBIN_MAGIC = 0xBA55ED50


def compact_fatbins(blob: bytes):
    """Return (new_blob, bytes_dropped). Only touches the .nv_fatbin section (found via ELF headers)."""
    b = bytearray(blob)
    if b[:4] != b"\x7fELF" or b[4] != 2:
        return blob, 0
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize)
    stroff = sh(shstrndx)[4]
    sec = None
    for i in range(shnum):
        name_off, _, _, _, off, size = sh(i)[:6]
        end = b.index(b"\0", stroff + name_off)
        if bytes(b[stroff + name_off:end]) == b".nv_fatbin":
            sec = (off, size)
    if sec is None:
        return blob, 0
    off, size = sec
    dropped = 0
    p = off
    while p + 16 <= off + size:
        magic, ver, hs, fs = struct.unpack_from("<IHHQ", b, p)
        if magic != FATBIN_MAGIC:
            p += 8
            continue
        q, end = p + hs, p + hs + fs
        ents = []
        while q < end:
            kind, _, ehs, psz = struct.unpack_from("<HHIQ", b, q)
            arch, = struct.unpack_from("<I", b, q + 28)
            ents.append((q, kind, ehs + psz, arch))
            q += ehs + psz
        # kind 1 = PTX, 2 = ELF cubin
        has90 = any(k == 2 and a == KEEP_ARCH for _, k, _, a in ents)
        if has90:
            keep = [e for e in ents if e[3] == KEEP_ARCH or (e[1] == 1 and e[3] < KEEP_ARCH)]
            if len(keep) < len(ents):
                chunks = b"".join(bytes(b[e[0]:e[0] + e[2]]) for e in keep)
                newfs = len(chunks)
                b[p + hs:p + hs + newfs] = chunks
                b[p + hs + newfs:end] = bytes(end - (p + hs + newfs))
                struct.pack_into("<Q", b, p + 8, newfs)
                dropped += fs - newfs
        p = end
    return bytes(b), dropped


def cubin_arch(data: bytes):
    if data[:4] != b"\x7fELF" or len(data) < 52:
        return None
    flags, = struct.unpack_from("<I", data, 48)
    # CUDA ELF ABI v8 (CUDA 12.8+): SM in bits 8..15; older ABI: SM in bits 0..7
    return (flags >> 8) & 0xFF if (flags & 0xFF) < 0x14 else flags & 0xFF


def rewrite(src, decide):
    """decide(name, data) -> None (drop) or bytes (keep, possibly modified)."""
    tmp = src + ".tmp"
    record_name, new_rows = None, {}
    removed = set()
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zo:
        for item in zi.infolist():
            if item.filename.endswith(".dist-info/RECORD"):
                record_name = item
                continue
            data = zi.read(item.filename)
            out = decide(item.filename, data)
            if out is None:
                removed.add(item.filename)
                continue
            if out is not data:
                h = base64.urlsafe_b64encode(hashlib.sha256(out).digest()).rstrip(b"=").decode()
                new_rows[item.filename] = f"{item.filename},sha256={h},{len(out)}"
            zo.writestr(item, out)
        rec = zi.read(record_name.filename).decode().splitlines()
        rows = []
        for line in rec:
            name = line.split(",", 1)[0]
            if name in removed:
                continue
            rows.append(new_rows.get(name, line))
        zo.writestr(record_name, "\n".join(rows) + "\n")
    os.replace(tmp, src)
    return removed


def main(d):
    (sk,) = glob.glob(os.path.join(d, "sglang_kernel-*.whl"))
    stats = {"dropped_fatbin": 0}

    def sk_decide(name, data):
        if name.startswith("sgl_kernel/sm100/"):
            return None
        if name == "sgl_kernel/load_utils.py":
            # sm100/ is gone: let every capability (and import without a GPU) load sm90/common_ops
            new = data.replace(b'ops_subdir = "sm100"', b'ops_subdir = "sm90"')
            return new if new != data else data
        if name.endswith(".so"):
            new, dropped = compact_fatbins(data)
            stats["dropped_fatbin"] += dropped
            return new if dropped else data
        return data

    before = os.path.getsize(sk)
    rm = rewrite(sk, sk_decide)
    print(f"sglang-kernel: {before/2**20:.0f} MiB -> {os.path.getsize(sk)/2**20:.0f} MiB; removed {sorted(rm)}; "
          f"non-sm90 fatbin entries dropped: {stats['dropped_fatbin']/2**20:.0f} MiB (uncompressed)")

    (fc,) = glob.glob(os.path.join(d, "flashinfer_cubin-*.whl"))
    kept = {"n": 0}

    def fc_decide(name, data):
        if name.endswith(".cubin") or data[:4] == b"\x7fELF":
            if cubin_arch(data) != KEEP_ARCH:
                return None
            kept["n"] += 1
        return data

    before = os.path.getsize(fc)
    rm = rewrite(fc, fc_decide)
    print(f"flashinfer-cubin: {before/2**20:.0f} MiB -> {os.path.getsize(fc)/2**20:.1f} MiB; "
          f"{len(rm)} non-sm90 cubins removed, {kept['n']} sm90 cubins kept")


if __name__ == "__main__":
    main(sys.argv[1])
