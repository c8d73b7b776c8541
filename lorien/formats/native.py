"""A C scanner for AutoTVM logs laid out as TVM writes them: the ingest fast path.

:func:`scan_autotvm` cuts every line of a block of log at its top-level keys (as
:meth:`lorien.formats.autotvm.Decoder.decode` does), checks and compacts its config, parses
its result into numbers and groups consecutive lines that share their ``input`` and version
tail. :func:`record_ids` hashes the record ids of a whole block with OpenSSL's SHA-256 (the
``libcrypto`` that Python's ``hashlib`` already loaded).

The scanner accepts only what it can reproduce exactly: a config with no escape, no
non-ASCII byte, no fraction or exponent, no duplicate key, no ``-0`` and no integer of 19
digits or more, whose compact JSON (what ``orjson.dumps(orjson.loads(raw))`` gives) is then
the raw text without its whitespace; a result ``[[number, ...], int32, number, number]``
with finite numbers and no negative zero. On any other line it stops and says which, and
the caller decodes the block in Python, which gives the same records or reports the error.

Set ``LORIEN_NATIVE=0`` to turn the scanner off; without a C compiler it is off by itself.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from typing import NamedTuple

import numpy as np

from lorien.native import NativeBuildError, load_shared

C_SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_KEYS 64

typedef const unsigned char *ptr;

static const char INPUT_HEAD[] = "{\"input\": ";        /* 10 bytes */
static const char CONFIG_MARK[] = ", \"config\": ";     /* 12 bytes */
static const char RESULT_MARK[] = ", \"result\": ";     /* 12 bytes */
static const char VERSION_MARK[] = ", \"version\": ";   /* 13 bytes */

static inline int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline ptr skip_ws(ptr p, ptr end) { while (p < end && is_ws(*p)) p++; return p; }

/* Offset of the last occurrence of mark (length m) lying wholly within [lo, hi), or -1. */
static int64_t rfind(ptr s, int64_t lo, int64_t hi, const char *mark, int64_t m) {
    for (int64_t i = hi - m; i >= lo; i--)
        if (s[i] == (unsigned char)mark[0] && memcmp(s + i, mark, m) == 0) return i;
    return -1;
}

/* ---- config: check the accepted subset of JSON and copy it without whitespace ---- */

static ptr cfg_value(ptr p, ptr end, unsigned char **out, int depth);

static ptr cfg_string(ptr p, ptr end, unsigned char **out) {   /* p at the opening quote */
    ptr s = p++;
    while (p < end && *p != '"') {
        if (*p == '\\' || *p < 0x20 || *p >= 0x7f) return NULL;
        p++;
    }
    if (p >= end) return NULL;
    p++;
    memcpy(*out, s, p - s);
    *out += p - s;
    return p;
}

static ptr cfg_number(ptr p, ptr end, unsigned char **out) {
    ptr s = p;
    if (*p == '-') p++;
    if (p >= end || !is_digit(*p)) return NULL;
    if (*p == '0') {
        p++;
        if (*s == '-') return NULL;                      /* -0 reads back as 0 */
    } else {
        while (p < end && is_digit(*p)) p++;
    }
    if (p < end && (is_digit(*p) || *p == '.' || *p == 'e' || *p == 'E')) return NULL;
    if (p - s - (*s == '-') > 18) return NULL;
    memcpy(*out, s, p - s);
    *out += p - s;
    return p;
}

static ptr cfg_literal(ptr p, ptr end, unsigned char **out, const char *word, int n) {
    if (end - p < n || memcmp(p, word, n) != 0) return NULL;
    memcpy(*out, word, n);
    *out += n;
    return p + n;
}

static ptr cfg_object(ptr p, ptr end, unsigned char **out, int depth) {   /* p after '{' */
    ptr keys[MAX_KEYS];
    int64_t key_len[MAX_KEYS];
    int n_keys = 0;
    *(*out)++ = '{';
    p = skip_ws(p, end);
    if (p < end && *p == '}') { *(*out)++ = '}'; return p + 1; }
    for (;;) {
        if (p >= end || *p != '"' || n_keys == MAX_KEYS) return NULL;
        ptr key = p;
        p = cfg_string(p, end, out);
        if (!p) return NULL;
        for (int k = 0; k < n_keys; k++)
            if (key_len[k] == p - key && memcmp(keys[k], key, p - key) == 0) return NULL;  /* duplicate */
        keys[n_keys] = key;
        key_len[n_keys++] = p - key;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return NULL;
        *(*out)++ = ':';
        p = cfg_value(skip_ws(p + 1, end), end, out, depth);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p < end && *p == ',') { *(*out)++ = ','; p = skip_ws(p + 1, end); continue; }
        if (p < end && *p == '}') { *(*out)++ = '}'; return p + 1; }
        return NULL;
    }
}

static ptr cfg_array(ptr p, ptr end, unsigned char **out, int depth) {   /* p after '[' */
    *(*out)++ = '[';
    p = skip_ws(p, end);
    if (p < end && *p == ']') { *(*out)++ = ']'; return p + 1; }
    for (;;) {
        p = cfg_value(p, end, out, depth);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p < end && *p == ',') { *(*out)++ = ','; p = skip_ws(p + 1, end); continue; }
        if (p < end && *p == ']') { *(*out)++ = ']'; return p + 1; }
        return NULL;
    }
}

static ptr cfg_value(ptr p, ptr end, unsigned char **out, int depth) {
    if (p >= end || depth > MAX_DEPTH) return NULL;
    switch (*p) {
    case '{': return cfg_object(p + 1, end, out, depth + 1);
    case '[': return cfg_array(p + 1, end, out, depth + 1);
    case '"': return cfg_string(p, end, out);
    case 't': return cfg_literal(p, end, out, "true", 4);
    case 'f': return cfg_literal(p, end, out, "false", 5);
    case 'n': return cfg_literal(p, end, out, "null", 4);
    default: return (*p == '-' || is_digit(*p)) ? cfg_number(p, end, out) : NULL;
    }
}

/* ---- result: [[costs...], error_no, all_cost, timestamp] ---- */

/* One JSON number at p (strict grammar), as a double; NULL unless finite and not -0.
   *integral tells whether it had neither fraction nor exponent. */
static ptr res_number(ptr p, ptr end, double *value, int *integral) {
    char buf[64];
    ptr s = p;
    if (p < end && *p == '-') p++;
    if (p >= end || !is_digit(*p)) return NULL;
    if (*p == '0') p++; else while (p < end && is_digit(*p)) p++;
    int64_t int_digits = p - s - (*s == '-');
    *integral = 1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p)) return NULL;
        while (p < end && is_digit(*p)) p++;
        *integral = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || !is_digit(*p)) return NULL;
        while (p < end && is_digit(*p)) p++;
        *integral = 0;
    }
    if (p < end && is_digit(*p)) return NULL;            /* a leading zero: not JSON */
    if ((*integral && int_digits > 18) || p - s >= (int64_t)sizeof buf) return NULL;
    memcpy(buf, s, p - s);
    buf[p - s] = 0;
    char *stop;
    double v = strtod(buf, &stop);
    if (stop != buf + (p - s) || !isfinite(v) || (v == 0.0 && signbit(v))) return NULL;
    if (*integral && v == 0.0 && *s == '-') return NULL;  /* -0 */
    *value = v;
    return p;
}

/* ---- the scanner ---- */

/* Scan rows of block [data, data + size). Per record line (blank and # lines are skipped):
   its start and length (newline included), the cuts (config, version), whether it starts a
   new group, its compact config (cfg_buf, cfg_off), costs (cost_val, cost_off), error_no,
   all_cost and timestamp. Returns the number of rows, or -(line number) of the first line
   (from 1) that the scanner does not take; *lines_out is then the number of lines. The caller
   sizes the outputs for the worst case: a row per 59 bytes (the shortest line taken; capacity
   rows at most), configs no longer than the block, a cost per two bytes. */
int64_t lorien_scan_autotvm(ptr data, int64_t size, int64_t capacity, int64_t *lines_out,
                            int64_t *line_start, int32_t *line_len, int32_t *cut_config, int32_t *cut_version,
                            uint8_t *group_start, unsigned char *cfg_buf, int32_t *cfg_off,
                            double *cost_val, int32_t *cost_off, int32_t *error_no, double *all_cost,
                            double *timestamp) {
    int64_t rows = 0, lineno = 0, pos = 0;
    ptr head = NULL, tail = NULL;
    int64_t head_len = 0, tail_len = 0, p_config_prev = 0;
    unsigned char *out = cfg_buf;
    int64_t n_costs = 0;
    cfg_off[0] = 0;
    cost_off[0] = 0;
    while (pos < size) {
        ptr line = data + pos;
        ptr nl = memchr(line, '\n', size - pos);
        int64_t len = nl ? (nl - line) + 1 : size - pos;
        pos += len;
        lineno++;
        int64_t p_config, p_result, p_version;
        int fresh = 0;
        if (head && len >= head_len + tail_len && memcmp(line, head, head_len) == 0
                && memcmp(line + len - tail_len, tail, tail_len) == 0) {
            p_config = p_config_prev;
            p_version = len - tail_len;
        } else if (len >= 10 && memcmp(line, INPUT_HEAD, 10) == 0) {
            ptr found = len > 10 ? memmem(line + 10, len - 10, CONFIG_MARK, 12) : NULL;
            p_version = rfind(line, 0, len, VERSION_MARK, 13);
            if (!found || p_version < 0) return -lineno;
            p_config = found - line;
            fresh = 1;
        } else {
            ptr q = line, e = line + len;
            while (q < e && (is_ws(*q) || *q == '\v' || *q == '\f')) q++;
            if (q == e || *q == '#') continue;              /* blank or comment: no record */
            return -lineno;
        }
        p_result = rfind(line, p_config, p_version, RESULT_MARK, 12);
        if (p_result < 0) return -lineno;
        /* config */
        ptr c = skip_ws(line + p_config + 12, line + p_result), c_end = line + p_result;
        if (c >= c_end || *c != '{') return -lineno;
        c = cfg_object(c + 1, c_end, &out, 1);
        if (!c || skip_ws(c, c_end) != c_end || out - cfg_buf > INT32_MAX) return -lineno;
        /* result */
        ptr r = skip_ws(line + p_result + 12, line + p_version), r_end = line + p_version;
        double v;
        int integral;
        if (r >= r_end || *r != '[') return -lineno;
        r = skip_ws(r + 1, r_end);
        if (r >= r_end || *r != '[') return -lineno;
        r = skip_ws(r + 1, r_end);
        if (r < r_end && *r == ']') {
            r++;
        } else {
            for (;;) {
                r = res_number(r, r_end, &v, &integral);
                if (!r) return -lineno;
                cost_val[n_costs++] = v;
                r = skip_ws(r, r_end);
                if (r < r_end && *r == ',') { r = skip_ws(r + 1, r_end); continue; }
                if (r < r_end && *r == ']') { r++; break; }
                return -lineno;
            }
        }
        double numbers[3];
        for (int k = 0; k < 3; k++) {
            r = skip_ws(r, r_end);
            if (r >= r_end || *r != ',') return -lineno;
            r = res_number(skip_ws(r + 1, r_end), r_end, &numbers[k], &integral);
            if (!r || (k == 0 && (!integral || numbers[0] < -2147483648.0 || numbers[0] >= 2147483648.0)))
                return -lineno;
        }
        r = skip_ws(r, r_end);
        if (r >= r_end || *r != ']' || skip_ws(r + 1, r_end) != r_end) return -lineno;
        if (rows == capacity) return -lineno;           /* cannot happen with the sizes asked for */
        if (fresh) {
            head = line; head_len = p_config + 12; p_config_prev = p_config;
            tail = line + p_version; tail_len = len - p_version;
        }
        line_start[rows] = line - data;
        line_len[rows] = (int32_t)len;
        cut_config[rows] = (int32_t)p_config;
        cut_version[rows] = (int32_t)p_version;
        group_start[rows] = (uint8_t)fresh;
        cfg_off[rows + 1] = (int32_t)(out - cfg_buf);
        cost_off[rows + 1] = (int32_t)n_costs;
        error_no[rows] = (int32_t)numbers[0];
        all_cost[rows] = numbers[1];
        timestamp[rows] = numbers[2];
        rows++;
    }
    *lines_out = lineno;
    return rows;
}

/* ---- record ids: SHA-256 through libcrypto's SHA256_Init / _Update / _Final ---- */

typedef int (*sha_init_fn)(void *);
typedef int (*sha_update_fn)(void *, const void *, size_t);
typedef int (*sha_final_fn)(unsigned char *, void *);

/* Per row: hex of the first 16 bytes of SHA-256(head[row_head[i]] (32 bytes) + config +
   costs (f64) + error_no (i64) + timestamp (f64) + number of costs (i64)), little-endian. */
void lorien_record_ids(int64_t n, const unsigned char *heads, const int32_t *row_head,
                       const unsigned char *cfg_buf, const int32_t *cfg_off, const double *cost_val,
                       const int32_t *cost_off, const int32_t *error_no, const double *timestamp,
                       void *init, void *update, void *final, char *hex) {
    static const char digits[] = "0123456789abcdef";
    _Alignas(64) unsigned char ctx[512];
    unsigned char md[32];
    for (int64_t i = 0; i < n; i++) {
        int64_t words[3];
        int64_t count = cost_off[i + 1] - cost_off[i];
        words[0] = error_no[i];
        memcpy(&words[1], &timestamp[i], 8);
        words[2] = count;
        ((sha_init_fn)init)(ctx);
        ((sha_update_fn)update)(ctx, heads + 32 * (int64_t)row_head[i], 32);
        ((sha_update_fn)update)(ctx, cfg_buf + cfg_off[i], cfg_off[i + 1] - cfg_off[i]);
        ((sha_update_fn)update)(ctx, cost_val + cost_off[i], 8 * count);
        ((sha_update_fn)update)(ctx, words, 24);
        ((sha_final_fn)final)(md, ctx);
        for (int k = 0; k < 16; k++) {
            hex[32 * i + 2 * k] = digits[md[k] >> 4];
            hex[32 * i + 2 * k + 1] = digits[md[k] & 15];
        }
    }
}
"""

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


class Scan(NamedTuple):
    """What :func:`scan_autotvm` found in a block: one entry per record line, in file order."""

    lines: int  # lines in the block, blank and comment lines included
    line_start: np.ndarray  # int64, byte offset of the line in the block
    line_len: np.ndarray  # int32, newline included
    cut_config: np.ndarray  # int32, offset of ', "config": ' in the line
    cut_version: np.ndarray  # int32, offset of ', "version": ' in the line
    group_start: np.ndarray  # bool, the line's input or version tail differs from the line before
    config_bytes: np.ndarray  # uint8, the compact configs one after another
    config_offsets: np.ndarray  # int32, n + 1
    cost_values: np.ndarray  # float64
    cost_offsets: np.ndarray  # int32, n + 1
    error_no: np.ndarray  # int32
    all_cost: np.ndarray  # float64
    timestamp: np.ndarray  # float64

    @property
    def rows(self) -> int:
        return len(self.line_start)


#: The shortest line the scanner takes: '{"input": ' ', "config": {}' ', "result": [[],0,0,0]' ', "version": '.
MIN_LINE = 10 + 14 + 22 + 13


def enabled() -> bool:
    """Whether the scanner is on (``LORIEN_NATIVE`` is not ``0``)."""
    return os.environ.get("LORIEN_NATIVE", "1") != "0"


def library() -> ctypes.CDLL | None:
    """The compiled scanner, or None where it is off or cannot be built."""
    if not enabled():
        return None
    with _LOCK:
        if "lib" not in _STATE:
            try:
                lib = load_shared(C_SOURCE, "autotvm_scan", ("-O2", "-std=gnu11"), libs=("-lm",))
            except (NativeBuildError, OSError) as exc:
                logging.getLogger(__name__).warning(
                    "the native AutoTVM scanner is unavailable, AutoTVM logs are decoded in Python "
                    "(about half as fast): %s", str(exc).splitlines()[0])
                lib = None
            else:
                lib.lorien_scan_autotvm.restype = ctypes.c_int64
                lib.lorien_scan_autotvm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 13
                lib.lorien_record_ids.restype = None
                lib.lorien_record_ids.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 12
            _STATE["lib"] = lib
        return _STATE["lib"]  # type: ignore[return-value]


def _address(array: np.ndarray) -> int:
    return array.ctypes.data


def scan_autotvm(data: bytes | memoryview) -> Scan | int:
    """The scan of a block of AutoTVM log (any buffer of whole lines); an int (the first line,
    from 1, it does not take) when the block needs the Python decoder. Raises RuntimeError when
    the scanner is off."""
    lib = library()
    if lib is None:
        raise RuntimeError("the native AutoTVM scanner is not available")
    block = np.frombuffer(data, dtype=np.uint8)
    size = len(block)
    capacity = size // MIN_LINE + 1
    lines = np.zeros(1, dtype=np.int64)
    line_start = np.empty(capacity, dtype=np.int64)
    line_len = np.empty(capacity, dtype=np.int32)
    cut_config = np.empty(capacity, dtype=np.int32)
    cut_version = np.empty(capacity, dtype=np.int32)
    group_start = np.empty(capacity, dtype=np.uint8)
    config_bytes = np.empty(size + 1, dtype=np.uint8)
    config_offsets = np.empty(capacity + 1, dtype=np.int32)
    cost_values = np.empty(size // 2 + 1, dtype=np.float64)  # a cost takes two bytes at least
    cost_offsets = np.empty(capacity + 1, dtype=np.int32)
    error_no = np.empty(capacity, dtype=np.int32)
    all_cost = np.empty(capacity, dtype=np.float64)
    timestamp = np.empty(capacity, dtype=np.float64)
    rows = lib.lorien_scan_autotvm(
        block.ctypes.data if size else None, size, capacity,
        *map(_address, (lines, line_start, line_len, cut_config, cut_version, group_start, config_bytes,
                        config_offsets, cost_values, cost_offsets, error_no, all_cost, timestamp)))
    if rows < 0:
        return int(-rows)
    return Scan(int(lines[0]), line_start[:rows], line_len[:rows], cut_config[:rows], cut_version[:rows],
                group_start[:rows].view(bool), config_bytes[:config_offsets[rows]], config_offsets[:rows + 1],
                cost_values[:cost_offsets[rows]], cost_offsets[:rows + 1], error_no[:rows], all_cost[:rows],
                timestamp[:rows])


def _libcrypto_sha256() -> tuple[int, int, int] | None:
    """Addresses of SHA256_Init, SHA256_Update and SHA256_Final in the libcrypto hashlib loaded."""
    try:
        import _hashlib  # noqa: F401  (maps libcrypto into this process)

        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcrypto" in line and "/" in line}
    except (ImportError, OSError):
        return None
    for path in sorted(paths):
        try:
            crypto = ctypes.CDLL(path)
            return tuple(ctypes.cast(getattr(crypto, name), ctypes.c_void_p).value
                         for name in ("SHA256_Init", "SHA256_Update", "SHA256_Final"))  # type: ignore[return-value]
        except (OSError, AttributeError):
            continue
    return None


def sha256_functions() -> tuple[int, int, int] | None:
    """libcrypto's SHA-256 functions, checked once against hashlib; None where not found."""
    lib = library()
    if lib is None:
        return None
    with _LOCK:
        if "sha" not in _STATE:
            functions = _libcrypto_sha256()
            if functions is not None:
                # every array is named: an address taken of a temporary would outlive the array
                heads = np.frombuffer(bytes(range(32)), dtype=np.uint8)
                row_head = np.zeros(1, dtype=np.int32)
                config = np.frombuffer(b'{"a":1}', dtype=np.uint8)
                config_offsets = np.array([0, 7], dtype=np.int32)
                costs = np.array([0.5, 0.25])
                cost_offsets = np.array([0, 2], dtype=np.int32)
                error_no = np.array([3], dtype=np.int32)
                timestamp = np.array([1.5])
                hex_out = ctypes.create_string_buffer(33)
                lib.lorien_record_ids(1, *map(_address, (heads, row_head, config, config_offsets, costs, cost_offsets,
                                                         error_no, timestamp)), *functions, hex_out)
                payload = bytes(range(32)) + b'{"a":1}' + costs.tobytes() + np.array([3], "<i8").tobytes() \
                    + np.array([1.5], "<f8").tobytes() + np.array([2], "<i8").tobytes()
                if hex_out.raw[:32] != hashlib.sha256(payload).hexdigest()[:32].encode():
                    functions = None
            _STATE["sha"] = functions
        return _STATE["sha"]  # type: ignore[return-value]


def record_ids(scan: Scan, heads: bytes, row_head: np.ndarray) -> bytes | None:
    """32 hex digits per row (the record ids), or None where libcrypto is not at hand.

    ``heads`` holds 32-byte record-id heads one after another; ``row_head[i]`` names row i's."""
    functions = sha256_functions()
    if functions is None:
        return None
    n = scan.rows
    hex_out = ctypes.create_string_buffer(32 * n + 1)
    head_array = np.frombuffer(heads, dtype=np.uint8)
    row_head = np.ascontiguousarray(row_head, dtype=np.int32)
    library().lorien_record_ids(n, _address(head_array), _address(row_head), _address(scan.config_bytes),
                                _address(scan.config_offsets), _address(scan.cost_values), _address(scan.cost_offsets),
                                _address(scan.error_no), _address(scan.timestamp), *functions, hex_out)
    return hex_out.raw[:32 * n]
