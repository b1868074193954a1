/* The hash chain's fast path in C: `improve.log.chain.check_chain` over lines as `LogEntry.to_line`
 * writes them, and a snapshot's text against its journaled stateHash (`improve.machine.fold`); and, for a
 * streamed replay, the walk over a block's lines in its first pass (`thread_runs`) and the split of a
 * block into checked lines in its second (`split_block`), below.
 *
 * Why C: verifying a replay hashes every entry and every journaled state (chain.py says what is hashed).
 * In Python each entry cost its sha256 (about 0.4 us for a 600-byte line, most of it the compression)
 * and as much again around it: hashlib's object and hex string, and the slicing and joining that cut the
 * hashed text out of the line. Here the text is hashed where it lies, in pieces (no copy of the line),
 * with one context reused, and the digest is compared as bytes: on `make bench`'s corpus the chain's
 * check went from twice the cost of its sha256s alone to 1.2 times.
 *
 * Nothing here decides anything chain.py does not: `links` verifies an entry only where the Python fast
 * path would (the same layout test, the same hash), and stops at the first entry it cannot verify,
 * which chain.py then judges as it always did (the canonical text, the diagnosis). An error inside
 * (an entry of another shape, a string that is no UTF-8) also just stops it there.
 *
 * The sha256 is OpenSSL's (libcrypto, the library Python's hashlib uses): one digest fetched once, one
 * context reused. setup.py builds this module optionally: without libcrypto's headers chain.py and
 * fold.py do the same in Python (`improve.native.digest`), as they do under IMPROVE_PURE.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <openssl/evp.h>
#include <string.h>

#define LINK_HEX 32 /* chain.HASH_HEX: an entryHash is the first 128 bits of the sha256, in hex */

/* One digest and one context for the process: every call holds the GIL and never releases it, so no two
 * calls use the context at once. */
static EVP_MD *sha256_md = NULL;
static EVP_MD_CTX *sha256_ctx = NULL;

static PyObject *s_verification, *s_entryHash, *s_stateHash, *s_schemaVersion, *s_threadId;
static PyObject *s_index, *s_machineId, *s_machineVersion, *s_event, *s_metadata, *s_attempts, *s_recordedAt, *s_type;

static const char NO_STATE[] = ",\"verification\":{\"entryHash\":\"";
static const char WITH_STATE[] = "\"verification\":{\"entryHash\":\"";
static const char STATE_KEY[] = "\",\"stateHash\":\"";
static const char STATE_ONLY[] = "\"verification\":{\"stateHash\":\"";

/* sha256 over the pieces, into `out` (32 bytes); 0 on failure. */
static int
digest(const char *const *pieces, const Py_ssize_t *sizes, int count, unsigned char *out)
{
    unsigned int size = 0;
    if (EVP_DigestInit_ex2(sha256_ctx, sha256_md, NULL) != 1)
        return 0;
    for (int i = 0; i < count; i++) {
        if (sizes[i] && EVP_DigestUpdate(sha256_ctx, pieces[i], (size_t)sizes[i]) != 1)
            return 0;
    }
    return EVP_DigestFinal_ex(sha256_ctx, out, &size) == 1 && size == 32;
}

/* Whether `hex` (`n` characters) is the lowercase hex of the first n/2 bytes of `raw`. */
static int
hex_is(const char *hex, Py_ssize_t n, const unsigned char *raw)
{
    static const char digits[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i += 2) {
        unsigned char byte = raw[i / 2];
        if (hex[i] != digits[byte >> 4] || hex[i + 1] != digits[byte & 15])
            return 0;
    }
    return 1;
}

static int
ends_with(const char *text, Py_ssize_t size, Py_ssize_t end, const char *what, Py_ssize_t n)
{
    /* Whether text[:end] ends with what[:n]. */
    (void)size;
    return end >= n && memcmp(text + end - n, what, (size_t)n) == 0;
}

/* The UTF-8 of an attribute that must be a str; NULL (no error set) for anything else. */
static const char *
text_attr(PyObject *value, Py_ssize_t *size)
{
    if (value == NULL || !PyUnicode_CheckExact(value))
        return NULL;
    const char *text = PyUnicode_AsUTF8AndSize(value, size);
    if (text == NULL)
        PyErr_Clear();
    return text;
}

/* Reading a struct's field where it lies. msgspec keeps a Struct's fields in slots, described by member
 * descriptors; PyObject_GetAttr finds the descriptor through the type on every read, and `links` read five
 * fields an entry that way (a tenth of a verified replay's extra cost). A type's slot offsets are looked
 * up once (`Slots`) and a field is then read at its offset, for objects of exactly that type. */
typedef struct {
    PyTypeObject *type;    /* the type the offsets are of (a strong reference), or NULL */
    PyTypeObject *without; /* the last type found without such slots (a strong reference), or NULL */
    Py_ssize_t offsets[8];
} Slots;

static Slots entry_slots, verification_slots, strict_slots, field_slots;

/* The offset of the object slot `name` of `type`, or -1 (no such slot: the caller reads it generically). */
static Py_ssize_t
slot_offset(PyTypeObject *type, PyObject *name)
{
    Py_ssize_t offset = -1;
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
    if (descr == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READ_RESTRICTED))
            offset = member->offset;
    }
    Py_DECREF(descr);
    return offset;
}

/* `slots` made for `type` and the `count` names, unless they are already; 0 when a name has no slot. */
static int
slots_for(Slots *slots, PyTypeObject *type, PyObject *const *names, int count)
{
    if (slots->type == type)
        return 1;
    if (slots->without == type)
        return 0; /* looked up before: not asked again for every object of it */
    Py_CLEAR(slots->type);
    int found = 1;
    for (int i = 0; i < count && found; i++) {
        slots->offsets[i] = slot_offset(type, names[i]);
        found = slots->offsets[i] >= 0;
    }
    Py_INCREF(type);
    if (found)
        slots->type = type;
    else
        Py_XSETREF(slots->without, type);
    return found;
}

/* The field at `offset` of `object`, a new reference; NULL with AttributeError set when it is unset. */
static PyObject *
slot_value(PyObject *object, Py_ssize_t offset)
{
    PyObject *value = *(PyObject **)((char *)object + offset);
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a struct field is unset");
        return NULL;
    }
    Py_INCREF(value);
    return value;
}

/* The field `name` of `object`, a new reference: at its slot's offset when `slots` are of the object's
 * type (`slots_for`), else read as an attribute; NULL with an error set when there is none. */
static PyObject *
field(PyObject *object, const Slots *slots, int i, PyObject *name)
{
    if (Py_TYPE(object) == slots->type)
        return slot_value(object, slots->offsets[i]);
    return PyObject_GetAttr(object, name);
}

/* links(entries, lines, start, opening, thread, tail, bulk) -> int
 *
 * Verify entries[start:] as chain.check_chain's fast path does, while each is a `bulk` instance of
 * schemaVersion 2 whose threadId is `thread` and whose line ends as `LogEntry.to_line` writes it with
 * `tail` (`line_tail(thread)`); `opening` is what the first one's hashed text starts with. Returns the
 * position of the first entry not verified (len(entries) when all were). */
static Py_ssize_t
walk_links(PyObject *entries, PyObject *lines, Py_ssize_t start, const char *opening_in, Py_ssize_t opening_size,
           PyObject *thread, const char *tail, Py_ssize_t tail_size, PyObject *bulk)
{
    PyObject *const hash_names[2] = {s_entryHash, s_stateHash};
    Py_ssize_t count = PyList_GET_SIZE(entries);
    if (PyList_GET_SIZE(lines) != count || start < 0)
        return start < 0 ? 0 : start;
    /* `opening` is `[` + previous as JSON + `,`: the thread id's (any length) for entry 0, then an
     * entryHash's, `["<32 hex>",` (35 bytes). */
    char link_opening[LINK_HEX + 4];
    const char *opening = opening_in;
    Py_ssize_t opening_len = opening_size;
    Py_ssize_t position = start;
    for (; position < count; position++) {
        PyObject *entry = PyList_GET_ITEM(entries, position);
        PyObject *line = PyList_GET_ITEM(lines, position);
        if (!PyObject_TypeCheck(entry, (PyTypeObject *)bulk) || !PyBytes_CheckExact(line))
            break;
        int ok = 0;
        PyObject *found_obj = NULL, *state_obj = NULL;
        PyObject *version = field(entry, &entry_slots, 0, s_schemaVersion);
        PyObject *entry_thread = version == NULL ? NULL : field(entry, &entry_slots, 1, s_threadId);
        PyObject *verification = entry_thread == NULL ? NULL : field(entry, &entry_slots, 2, s_verification);
        if (verification == NULL)
            goto done;
        if (!PyLong_CheckExact(version) || PyLong_AsLong(version) != 2)
            goto done;
        if (entry_thread != thread) {
            int same = PyObject_RichCompareBool(entry_thread, thread, Py_EQ);
            if (same != 1)
                goto done;
        }
        if (verification == Py_None)
            goto done;
        slots_for(&verification_slots, Py_TYPE(verification), hash_names, 2);
        found_obj = field(verification, &verification_slots, 0, s_entryHash);
        state_obj = found_obj == NULL ? NULL : field(verification, &verification_slots, 1, s_stateHash);
        if (state_obj == NULL)
            goto done;
        Py_ssize_t found_size, state_size = 0;
        const char *found = text_attr(found_obj, &found_size);
        if (found == NULL || found_size != LINK_HEX)
            goto done;
        const char *state = NULL;
        if (state_obj != Py_None) {
            state = text_attr(state_obj, &state_size);
            if (state == NULL)
                goto done;
        }
        const char *text = PyBytes_AS_STRING(line);
        Py_ssize_t size = PyBytes_GET_SIZE(line);
        /* The line's end, read backwards: tail, `"}`, [stateHash member], the entryHash, its key. */
        Py_ssize_t end = size;
        if (!ends_with(text, size, end, tail, tail_size))
            goto done;
        end -= tail_size;
        if (!ends_with(text, size, end, "\"}", 2))
            goto done;
        end -= 2;
        const char *pieces[6];
        Py_ssize_t sizes[6];
        int n = 0;
        if (state == NULL) {
            if (!ends_with(text, size, end, found, LINK_HEX))
                goto done;
            end -= LINK_HEX;
            if (!ends_with(text, size, end, NO_STATE, sizeof NO_STATE - 1))
                goto done;
            end -= sizeof NO_STATE - 1;
            pieces[0] = opening, sizes[0] = opening_len;
            pieces[1] = text, sizes[1] = end;
            pieces[2] = "}]", sizes[2] = 2;
            n = 3;
        } else {
            if (!ends_with(text, size, end, state, state_size))
                goto done;
            end -= state_size;
            if (!ends_with(text, size, end, STATE_KEY, sizeof STATE_KEY - 1))
                goto done;
            end -= sizeof STATE_KEY - 1;
            if (!ends_with(text, size, end, found, LINK_HEX))
                goto done;
            end -= LINK_HEX;
            if (!ends_with(text, size, end, WITH_STATE, sizeof WITH_STATE - 1))
                goto done;
            end -= sizeof WITH_STATE - 1;
            pieces[0] = opening, sizes[0] = opening_len;
            pieces[1] = text, sizes[1] = end;
            pieces[2] = STATE_ONLY, sizes[2] = sizeof STATE_ONLY - 1;
            pieces[3] = state, sizes[3] = state_size;
            pieces[4] = "\"}}]", sizes[4] = 4;
            n = 5;
        }
        unsigned char raw[32];
        if (!digest(pieces, sizes, n, raw) || !hex_is(found, LINK_HEX, raw))
            goto done;
        /* The next entry's text opens with this one's entryHash, quoted: hex is its own JSON text. */
        link_opening[0] = '[';
        link_opening[1] = '"';
        memcpy(link_opening + 2, found, LINK_HEX);
        link_opening[LINK_HEX + 2] = '"';
        link_opening[LINK_HEX + 3] = ',';
        opening = link_opening;
        opening_len = LINK_HEX + 4;
        ok = 1;
    done:
        Py_XDECREF(version);
        Py_XDECREF(entry_thread);
        Py_XDECREF(verification);
        Py_XDECREF(found_obj);
        Py_XDECREF(state_obj);
        if (!ok) {
            PyErr_Clear(); /* an entry of another shape: chain.py judges it */
            break;
        }
    }
    return position;
}

static PyObject *
links(PyObject *self, PyObject *args)
{
    PyObject *entries, *lines, *thread, *bulk;
    Py_ssize_t start;
    const char *opening, *tail;
    Py_ssize_t opening_size, tail_size;
    if (!PyArg_ParseTuple(args, "O!O!ny#Oy#O!", &PyList_Type, &entries, &PyList_Type, &lines, &start,
                          &opening, &opening_size, &thread, &tail, &tail_size, &PyType_Type, &bulk))
        return NULL;
    PyObject *const entry_names[3] = {s_schemaVersion, s_threadId, s_verification};
    slots_for(&entry_slots, (PyTypeObject *)bulk, entry_names, 3);
    return PyLong_FromSsize_t(
        walk_links(entries, lines, start, opening, opening_size, thread, tail, tail_size, bulk));
}

/* Whether `text` is a str of printable ASCII without a quote or a backslash: its JSON text is itself,
 * quoted (msgspec's and json's alike); its characters and their number in `*chars`, `*size`. */
static int
plain_string(PyObject *text, const char **chars, Py_ssize_t *size)
{
    if (!PyUnicode_CheckExact(text) || !PyUnicode_IS_ASCII(text))
        return 0;
    const char *data = (const char *)PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    for (Py_ssize_t i = 0; i < n; i++)
        if (data[i] < ' ' || data[i] > '~' || data[i] == '"' || data[i] == '\\')
            return 0;
    *chars = data, *size = n;
    return 1;
}

/* chain_links(entries, lines, seed, bulk) -> int: `links` from the first entry, for a thread whose chain
 * is seeded by `seed` (its id) and whose entries carry the first one's threadId: the opening and the line's
 * tail made here, where `chain.checked_chain` made them in Python for every thread (with the call, a
 * third of the chain check's cost beyond its sha256s). 0 (the caller checks the slow way) when either id
 * is not plain ASCII (`plain_string`). */
#define MAX_PLAIN_ID 256
static PyObject *
chain_links(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "chain_links(entries: list, lines: list, seed: str, bulk: type)");
        return NULL;
    }
    PyObject *entries = args[0], *lines = args[1], *seed = args[2], *bulk = args[3];
    PyObject *const entry_names[3] = {s_schemaVersion, s_threadId, s_verification};
    slots_for(&entry_slots, (PyTypeObject *)bulk, entry_names, 3);
    if (PyList_GET_SIZE(entries) == 0 || Py_TYPE(PyList_GET_ITEM(entries, 0)) != entry_slots.type)
        return PyLong_FromLong(0);
    PyObject *thread = slot_value(PyList_GET_ITEM(entries, 0), entry_slots.offsets[1]);
    if (thread == NULL)
        return NULL;
    const char *seed_chars, *thread_chars = NULL;
    Py_ssize_t seed_size, thread_size = 0;
    Py_ssize_t position = 0;
    if (plain_string(seed, &seed_chars, &seed_size) && seed_size <= MAX_PLAIN_ID &&
        (thread == Py_None || (plain_string(thread, &thread_chars, &thread_size) && thread_size <= MAX_PLAIN_ID))) {
        static const char KEY[] = ",\"threadId\":\"";
        char opening[MAX_PLAIN_ID + 4], tail[MAX_PLAIN_ID + sizeof KEY + 2];
        opening[0] = '[', opening[1] = '"';
        memcpy(opening + 2, seed_chars, (size_t)seed_size);
        opening[seed_size + 2] = '"', opening[seed_size + 3] = ',';
        Py_ssize_t tail_size = 1;
        tail[0] = '}';
        if (thread != Py_None) {
            memcpy(tail, KEY, sizeof KEY - 1);
            memcpy(tail + sizeof KEY - 1, thread_chars, (size_t)thread_size);
            tail_size = (Py_ssize_t)(sizeof KEY - 1) + thread_size;
            tail[tail_size++] = '"';
            tail[tail_size++] = '}';
        }
        position = walk_links(entries, lines, 0, opening, seed_size + 4, thread, tail, tail_size, bulk);
    }
    Py_DECREF(thread);
    return PyLong_FromSsize_t(position);
}


/* sha256_is(pieces, hexdigest) -> bool: whether hashlib.sha256(b"".join(pieces)).hexdigest() ==
 * hexdigest, for a tuple of bytes (a snapshot's text in the pieces the fold keeps: `fold._snapshot_pieces`),
 * hashed where they lie. */
#define MAX_PIECES 16
static PyObject *
sha256_is(PyObject *self, PyObject *args)
{
    PyObject *parts, *expected;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &parts, &expected))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(parts);
    if (count > MAX_PIECES) {
        PyErr_SetString(PyExc_ValueError, "sha256_is: at most 16 pieces");
        return NULL;
    }
    const char *pieces[MAX_PIECES];
    Py_ssize_t sizes[MAX_PIECES];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *piece = PyTuple_GET_ITEM(parts, i);
        if (!PyBytes_CheckExact(piece)) {
            PyErr_SetString(PyExc_TypeError, "sha256_is: every piece is bytes");
            return NULL;
        }
        pieces[i] = PyBytes_AS_STRING(piece);
        sizes[i] = PyBytes_GET_SIZE(piece);
    }
    Py_ssize_t size;
    const char *hex = text_attr(expected, &size);
    unsigned char raw[32];
    int same = hex != NULL && size == 64 && digest(pieces, sizes, (int)count, raw) && hex_is(hex, 64, raw);
    return PyBool_FromLong(same);
}

/* The index of the quote that closes the JSON string whose text starts at text[i] (after its opening
 * quote), or -1: the next quote not escaped, found with memchr (a context's strings are most of its text:
 * walking them byte by byte made its text slower to patch than to write whole). */
static Py_ssize_t
string_end(const char *text, Py_ssize_t i, Py_ssize_t n)
{
    while (i < n) {
        const char *quote = memchr(text + i, '"', (size_t)(n - i));
        if (quote == NULL)
            return -1;
        Py_ssize_t at = quote - text, escapes = 0;
        while (at - escapes - 1 >= i && text[at - escapes - 1] == '\\')
            escapes++;
        if (escapes % 2 == 0)
            return at;
        i = at + 1;
    }
    return -1;
}

/* Where the JSON value that starts at text[i] ends, in compact JSON as msgspec writes it: the index of the
 * `,` or closing bracket after it at its own level, or `n` at the text's end; -1 when the text does not
 * close as JSON does (an unterminated string, a bracket closed that was never opened). */
static Py_ssize_t
value_end(const char *text, Py_ssize_t i, Py_ssize_t n)
{
    Py_ssize_t depth = 0;
    while (i < n) {
        char c = text[i];
        if (c == '"') {
            i = string_end(text, i + 1, n);
            if (i < 0)
                return -1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0)
                return i;
            depth--;
        } else if (c == ',' && depth == 0) {
            return i;
        }
        i++;
    }
    return depth == 0 ? n : -1;
}

/* context_text(context, before, before_text, encode) -> bytes or None: msgspec's text of the dict
 * `context` (`encode(context)`, its keys in their own order), made from `before_text`, the text `encode`
 * wrote of the dict `before`, when `context` has the same keys in the same order: a member whose value
 * is the very object it was in `before` is copied from `before_text`, any other value is written by
 * `encode`. None (the caller writes the whole) when the keys differ or `before_text` is not a compact
 * JSON object with a member for each. Why: a step assigns a key or two of a context of ten or more, and a
 * verified replay wrote every new context whole, about 0.9 us each, a tenth of its extra cost. The same
 * text as `encode(context)` because a JSON object's text is its members' texts in order, and a value
 * never changes in place (the fold's contract: an assign makes a new dict; `fold._plain_run` relies on it
 * too). */
static PyObject *
context_text(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "context_text takes 4 arguments");
        return NULL;
    }
    PyObject *context = args[0], *before = args[1], *before_text = args[2], *encode = args[3];
    if (!PyDict_CheckExact(context) || !PyDict_CheckExact(before) || !PyBytes_CheckExact(before_text))
        Py_RETURN_NONE;
    Py_ssize_t count = PyDict_GET_SIZE(context);
    const char *text = PyBytes_AS_STRING(before_text);
    Py_ssize_t size = PyBytes_GET_SIZE(before_text);
    if (count == 0 || count != PyDict_GET_SIZE(before) || size < 2 || text[0] != '{' || text[size - 1] != '}')
        Py_RETURN_NONE;
    /* Per member: where its text starts, where its value starts, and its new value's text (NULL: kept). */
    Py_ssize_t *spans = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)count);
    PyObject **written = PyMem_Calloc((size_t)count, sizeof(PyObject *));
    PyObject *result = NULL;
    if (spans == NULL || written == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t at = 1, pos = 0, old_pos = 0, total = 2, member = 0;
    PyObject *key, *value, *old_key, *old_value;
    while (PyDict_Next(context, &pos, &key, &value)) {
        if (!PyDict_Next(before, &old_pos, &old_key, &old_value))
            goto none;
        if (key != old_key) {
            if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(old_key) ||
                PyUnicode_Compare(key, old_key) != 0) {
                if (PyErr_Occurred())
                    goto done;
                goto none;
            }
        }
        /* The member's text in `before_text`: a key (a string), a colon, the value, then `,` or `}`. */
        if (at >= size || text[at] != '"')
            goto none;
        Py_ssize_t close = string_end(text, at + 1, size); /* the key's closing quote */
        if (close < 0 || close + 1 >= size || text[close + 1] != ':')
            goto none;
        Py_ssize_t start = close + 2, end = value_end(text, start, size);
        if (end < 0 || end >= size || (text[end] != ',' && end != size - 1))
            goto none;
        spans[2 * member] = at, spans[2 * member + 1] = start;
        if (value == old_value) {
            total += end - at;
        } else {
            PyObject *own = PyObject_CallOneArg(encode, value);
            if (own == NULL)
                goto done;
            if (!PyBytes_CheckExact(own)) {
                Py_DECREF(own);
                goto none;
            }
            written[member] = own;
            total += start - at + PyBytes_GET_SIZE(own);
        }
        member++;
        at = end + 1;
    }
    if (at != size)
        goto none;
    total += count - 1; /* the commas; `total` began with the braces */
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(result);
    *out++ = '{';
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t from = spans[2 * i], value_at = spans[2 * i + 1];
        Py_ssize_t to = i + 1 < count ? spans[2 * i + 2] - 1 : size - 1; /* its `,` or the `}` */
        if (i)
            *out++ = ',';
        if (written[i] == NULL) {
            memcpy(out, text + from, (size_t)(to - from));
            out += to - from;
        } else {
            memcpy(out, text + from, (size_t)(value_at - from));
            out += value_at - from;
            memcpy(out, PyBytes_AS_STRING(written[i]), (size_t)PyBytes_GET_SIZE(written[i]));
            out += PyBytes_GET_SIZE(written[i]);
        }
    }
    *out = '}';
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    if (written != NULL)
        for (Py_ssize_t i = 0; i < count; i++)
            Py_XDECREF(written[i]);
    PyMem_Free(written);
    PyMem_Free(spans);
    return result;
}

/* state_is(context_text, input_text, rest, hexdigest) -> bool: `sha256_is` of the snapshot text
 * `fold._snapshot_pieces` gives a run without error: `{"context":` context `,"error":null,"input":` input
 * `,` rest. The hash of everything before the rest is kept (`prefix`), with the two texts it was of: a state
 * that keeps the context and input of the state hashed before (a step that assigns nothing, as a third of
 * a replay's steps do) hashes only its rest, from a copy of that. */
static EVP_MD_CTX *prefix = NULL;
static PyObject *prefix_context = NULL, *prefix_input = NULL; /* strong references: compared by identity */

static PyObject *
state_is(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    static const char OPEN[] = "{\"context\":", MIDDLE[] = ",\"error\":null,\"input\":";
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]) ||
        !PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "state_is(context_text, input_text, rest, hexdigest): three bytes and a str");
        return NULL;
    }
    PyObject *context = args[0], *input = args[1], *rest = args[2];
    Py_ssize_t size;
    const char *hex = text_attr(args[3], &size);
    if (hex == NULL || size != 64)
        Py_RETURN_FALSE;
    if (context != prefix_context || input != prefix_input) {
        Py_CLEAR(prefix_context);
        Py_CLEAR(prefix_input);
        if (EVP_DigestInit_ex2(prefix, sha256_md, NULL) != 1 ||
            EVP_DigestUpdate(prefix, OPEN, sizeof OPEN - 1) != 1 ||
            EVP_DigestUpdate(prefix, PyBytes_AS_STRING(context), (size_t)PyBytes_GET_SIZE(context)) != 1 ||
            EVP_DigestUpdate(prefix, MIDDLE, sizeof MIDDLE - 1) != 1 ||
            EVP_DigestUpdate(prefix, PyBytes_AS_STRING(input), (size_t)PyBytes_GET_SIZE(input)) != 1 ||
            EVP_DigestUpdate(prefix, ",", 1) != 1)
            Py_RETURN_FALSE;
        Py_INCREF(context);
        Py_INCREF(input);
        prefix_context = context, prefix_input = input;
    }
    unsigned char raw[32];
    unsigned int length = 0;
    int same = EVP_MD_CTX_copy_ex(sha256_ctx, prefix) == 1 &&
               EVP_DigestUpdate(sha256_ctx, PyBytes_AS_STRING(rest), (size_t)PyBytes_GET_SIZE(rest)) == 1 &&
               EVP_DigestFinal_ex(sha256_ctx, raw, &length) == 1 && length == 32 && hex_is(hex, 64, raw);
    return PyBool_FromLong(same);
}

/* entry_fields(entry) -> (index, machineId, machineVersion, threadId, event, metadata, attempts,
 * verification): the fields `replay` reads of every entry, in one call. Compiled code reads a msgspec
 * struct's field as any attribute (the type's member descriptor found and called each time: about 35 ns,
 * where the interpreter's specialized read takes 5), and a replay read eight an entry, a twentieth of it.
 * An entry of another type (pydantic's `LogEntry`) is read by its attributes. */
static PyObject *
entry_fields(PyObject *self, PyObject *entry)
{
    PyObject *const names[8] = {s_index, s_machineId, s_machineVersion, s_threadId,
                                s_event,  s_metadata,  s_attempts,       s_verification};
    slots_for(&field_slots, Py_TYPE(entry), names, 8);
    PyObject *fields = PyTuple_New(8);
    if (fields == NULL)
        return NULL;
    for (int i = 0; i < 8; i++) {
        PyObject *value = field(entry, &field_slots, i, names[i]);
        if (value == NULL) {
            Py_DECREF(fields);
            return NULL;
        }
        PyTuple_SET_ITEM(fields, i, value);
    }
    return fields;
}

/* Days in `month` of `year`, in the proleptic Gregorian calendar (datetime's). */
static int
days_in(int year, int month)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return days[month - 1] + (month == 2 && leap);
}

/* The number of the `n` ASCII digits at text[at], or -1 when one is no digit. */
static int
digits(const char *text, int at, int n)
{
    int number = 0;
    for (int i = at; i < at + n; i++) {
        if (text[i] < '0' || text[i] > '9')
            return -1;
        number = number * 10 + (text[i] - '0');
    }
    return number;
}

/* entry_ok(entry) -> bool or None: `strict.read_strictly`'s checks of a decoded entry: its event's type
 * is a non-empty string and `strict.valid_recorded_at(entry.recordedAt)`, for a timestamp as improve
 * writes it (`2026-12-04T10:56:46.321955Z`: a valid date and time to the second, six digits, `Z`);
 * None, for the caller to judge, for a timestamp of any other layout, or an event that is no dict. In
 * compiled Python the two reads and the checks were a twentieth of a replay. */
static PyObject *
entry_ok(PyObject *self, PyObject *entry)
{
    PyObject *const names[2] = {s_event, s_recordedAt};
    slots_for(&strict_slots, Py_TYPE(entry), names, 2);
    PyObject *event = field(entry, &strict_slots, 0, s_event);
    PyObject *stamp = event == NULL ? NULL : field(entry, &strict_slots, 1, s_recordedAt);
    PyObject *result = Py_None;
    if (stamp == NULL)
        goto done;
    if (!PyDict_CheckExact(event) || !PyUnicode_CheckExact(stamp))
        goto done;
    PyObject *kind = PyDict_GetItemWithError(event, s_type);
    if (kind == NULL) {
        if (PyErr_Occurred())
            goto done;
        result = Py_False;
        goto done;
    }
    if (!PyUnicode_Check(kind) || PyUnicode_GET_LENGTH(kind) == 0) {
        result = Py_False;
        goto done;
    }
    if (!PyUnicode_IS_ASCII(stamp) || PyUnicode_GET_LENGTH(stamp) != 27)
        goto done;
    const char *t = (const char *)PyUnicode_DATA(stamp);
    if (t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' || t[16] != ':' || t[19] != '.' ||
        t[26] != 'Z' || digits(t, 20, 6) < 0)
        goto done;
    int year = digits(t, 0, 4), month = digits(t, 5, 2), day = digits(t, 8, 2);
    int hour = digits(t, 11, 2), minute = digits(t, 14, 2), second = digits(t, 17, 2);
    if (year < 0 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0)
        goto done; /* not the layout: the caller's to judge */
    int valid = year >= 1 && month >= 1 && month <= 12 && day >= 1 && day <= days_in(year, month) &&
                hour <= 23 && minute <= 59 && second <= 59;
    result = valid ? Py_True : Py_False;
done:
    Py_XDECREF(event);
    Py_XDECREF(stamp);
    if (result == Py_None && PyErr_Occurred())
        return NULL;
    Py_INCREF(result);
    return result;
}

/* The thread a line gives in its ending, as `stream._ending` and `stream._THREAD_TAIL` read it: when
 * line[:end] (from `start`) ends with its last `"threadId"` key (after a byte that is no backslash), a
 * colon, a string of printable ASCII without a quote or a backslash and the closing brace (spaces and
 * tabs between), sets `*cut` where the ending starts (the byte before the key) and `*id`, `*id_size` to
 * the string's text, and returns 1; else 0. */
static int
thread_ending(const char *data, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *cut, const char **id,
              Py_ssize_t *id_size)
{
    static const char KEY[] = "\"threadId\"";
    const Py_ssize_t key = sizeof KEY - 1;
    Py_ssize_t at = end - key;
    while (at >= start && memcmp(data + at, KEY, (size_t)key) != 0)
        at--;
    if (at < start + 1 || data[at - 1] == '\\')
        return 0;
    Py_ssize_t i = at + key;
    while (i < end && (data[i] == ' ' || data[i] == '\t'))
        i++;
    if (i >= end || data[i++] != ':')
        return 0;
    while (i < end && (data[i] == ' ' || data[i] == '\t'))
        i++;
    if (i >= end || data[i++] != '"')
        return 0;
    Py_ssize_t opened = i;
    while (i < end && data[i] >= ' ' && data[i] <= '~' && data[i] != '"' && data[i] != '\\')
        i++;
    if (i >= end || data[i] != '"')
        return 0;
    *id = data + opened, *id_size = i - opened;
    i++;
    while (i < end && (data[i] == ' ' || data[i] == '\t'))
        i++;
    if (i != end - 1 || data[i] != '}')
        return 0;
    *cut = at - 1;
    return 1;
}

/* Appends the run `*what` of `count` lines to `runs` and clears `*what`; 0 on failure. */
static int
close_run(PyObject *runs, PyObject **what, Py_ssize_t count)
{
    PyObject *n = PyLong_FromSsize_t(count);
    int failed = n == NULL || PyList_Append(runs, *what) < 0 || PyList_Append(runs, n) < 0;
    Py_XDECREF(n);
    Py_CLEAR(*what);
    return !failed;
}

/* thread_runs(block, ending, cr) -> (runs, ending): the first pass of a streamed replay
 * (`stream._returning_threads`) over one block of whole lines, in one walk. A line that ends as the one
 * before with its thread (`ending`: how that line ended, from the byte before its `"threadId"` key; the
 * line without its LF, and without its CR when `cr`, at least as long and ending with it) is that
 * thread's; a line that ends with another thread is that thread's, and its ending is then the one tested;
 * any other line is to be decoded. `runs` is flat, two items a run of lines: what they are (None: the
 * thread of the line before the block; a str: the thread their ending gives, as written; bytes: the one
 * line, to decode) and how many; `ending` is the last line's ending (None when it has none). In Python
 * the pass cost about 2 us a thread beyond the walk (slicing the first line of each, a regular expression
 * twice, a call into C per thread), a tenth of a streamed replay. */
static PyObject *
thread_runs(PyObject *self, PyObject *args)
{
    PyObject *block, *ending_in;
    int cr;
    if (!PyArg_ParseTuple(args, "O!Op", &PyBytes_Type, &block, &ending_in, &cr))
        return NULL;
    if (ending_in != Py_None && !PyBytes_Check(ending_in)) {
        PyErr_SetString(PyExc_TypeError, "thread_runs: the ending is bytes or None");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(block);
    Py_ssize_t size = PyBytes_GET_SIZE(block);
    /* The ending tested: the one given, then the last line's that had one (within the block). */
    const char *tail = ending_in == Py_None ? NULL : PyBytes_AS_STRING(ending_in);
    Py_ssize_t length = tail == NULL ? 0 : PyBytes_GET_SIZE(ending_in);
    int from_block = 0; /* whether `tail` points into the block */
    PyObject *runs = PyList_New(0);
    if (runs == NULL)
        return NULL;
    PyObject *what = NULL; /* the open run's first item (a new reference), when a run is open */
    Py_ssize_t count = 0;
    Py_ssize_t start = 0;
    while (start < size) {
        const char *found = memchr(data + start, '\n', (size_t)(size - start));
        Py_ssize_t stop = found != NULL ? found - data : size;
        Py_ssize_t end = cr && stop > start && data[stop - 1] == '\r' ? stop - 1 : stop;
        if (tail != NULL && end - start >= length && memcmp(data + end - length, tail, (size_t)length) == 0) {
            if (what == NULL) {
                what = Py_None;
                Py_INCREF(what);
            }
            count++;
            start = stop + 1;
            continue;
        }
        if (what != NULL && !close_run(runs, &what, count))
            goto error;
        Py_ssize_t cut, id_size;
        const char *id;
        if (thread_ending(data, start, end, &cut, &id, &id_size)) {
            what = PyUnicode_DecodeASCII(id, id_size, NULL);
            tail = data + cut, length = end - cut, from_block = 1;
        } else {
            what = PyBytes_FromStringAndSize(data + start, end - start);
            tail = NULL, length = 0, from_block = 0;
        }
        if (what == NULL)
            goto error;
        count = 1;
        start = stop + 1;
    }
    if (what != NULL && !close_run(runs, &what, count))
        goto error;
    PyObject *ending;
    if (tail == NULL)
        ending = Py_None, Py_INCREF(ending);
    else if (!from_block)
        ending = ending_in, Py_INCREF(ending);
    else if ((ending = PyBytes_FromStringAndSize(tail, length)) == NULL)
        goto error;
    return Py_BuildValue("NN", runs, ending);
error:
    Py_XDECREF(what);
    Py_DECREF(runs);
    return NULL;
}

/* The opening brackets (`[` and `{`) of data[start:stop]: a bound on how deep a line nests (brackets in
 * strings count too). A loop the compiler vectorizes. */
static Py_ssize_t
opening_brackets(const char *data, Py_ssize_t start, Py_ssize_t stop)
{
    Py_ssize_t brackets = 0;
    for (Py_ssize_t i = start; i < stop; i++)
        brackets += (data[i] == '[') | (data[i] == '{');
    return brackets;
}

/* The line of data[:size] from `start`: where it stops (its LF, or the end), its opening brackets, and
 * `*fit` cleared when it has more than `max_depth` of them or more than `max_bytes` bytes; whether it
 * ends with an LF. */
static int
next_line(const char *data, Py_ssize_t size, Py_ssize_t start, Py_ssize_t max_depth, Py_ssize_t max_bytes,
          Py_ssize_t *stop, Py_ssize_t *brackets, int *fit)
{
    const char *found = start < size ? memchr(data + start, '\n', (size_t)(size - start)) : NULL;
    *stop = found != NULL ? found - data : size;
    *brackets = opening_brackets(data, start, *stop);
    if (*brackets > max_depth || *stop - start > max_bytes)
        *fit = 0;
    return found != NULL;
}

/* scan_block(data, max_depth, max_bytes) -> (breaks, fit) or None: `lines.scan_lines`' test of a whole
 * buffer, in one walk: its LFs, and whether no LF-separated line has more than `max_depth` opening
 * brackets nor more than `max_bytes` bytes; None (the caller counts line by line) when an LF-ended line
 * has no opening bracket (so is perhaps blank). In Python, `translate` to the brackets and the searches
 * after it cost about 2 ns a byte, a fifth of what an ingest adds to DuckDB's own reading. */
static PyObject *
scan_block(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t max_depth, max_bytes;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &max_depth, &max_bytes))
        return NULL;
    const char *data = view.buf;
    Py_ssize_t size = view.len, start = 0, breaks = 0;
    int fit = 1, bracketed = 1;
    for (;;) {
        Py_ssize_t stop, brackets;
        int found = next_line(data, size, start, max_depth, max_bytes, &stop, &brackets, &fit);
        if (!found)
            break;
        if (brackets == 0) {
            bracketed = 0;
            break;
        }
        breaks++;
        start = stop + 1;
    }
    PyBuffer_Release(&view);
    if (!bracketed)
        Py_RETURN_NONE;
    return Py_BuildValue("nO", breaks, fit ? Py_True : Py_False);
}

/* split_block(block, max_depth, max_bytes) -> (lines, fit, breaks) or None: `stream._lines_of`'s checked
 * split of a block of whole lines in one walk, where Python took five (`lines.bracketed_lines`'s
 * `translate`, its searches, `split`, `lines_fit` twice): the LF-separated lines, the text after the last
 * LF left out when it is blank (`bytes.strip`'s whitespace); `fit` whether no line has more than
 * `max_depth` opening brackets nor more than `max_bytes` bytes; `breaks` the block's LFs. None (the
 * caller splits the slow, exact way) when the block holds a CR or an LF-ended line without an opening
 * bracket (so perhaps blank). The translate alone was a sixteenth of a streamed replay. */
static PyObject *
split_block(PyObject *self, PyObject *args)
{
    PyObject *block;
    Py_ssize_t max_depth, max_bytes;
    if (!PyArg_ParseTuple(args, "O!nn", &PyBytes_Type, &block, &max_depth, &max_bytes))
        return NULL;
    const char *data = PyBytes_AS_STRING(block);
    Py_ssize_t size = PyBytes_GET_SIZE(block);
    if (size && memchr(data, '\r', (size_t)size) != NULL)
        Py_RETURN_NONE;
    PyObject *lines = PyList_New(0);
    if (lines == NULL)
        return NULL;
    int fit = 1;
    Py_ssize_t breaks = 0, start = 0;
    for (;;) {
        Py_ssize_t stop, brackets;
        int found = next_line(data, size, start, max_depth, max_bytes, &stop, &brackets, &fit);
        if (found) {
            if (brackets == 0) {
                Py_DECREF(lines);
                Py_RETURN_NONE;
            }
            breaks++;
        } else {
            int blank = 1;
            for (Py_ssize_t i = start; i < stop && blank; i++)
                blank = memchr(" \t\n\r\x0b\x0c", data[i], 6) != NULL;
            if (blank)
                break;
        }
        PyObject *line = PyBytes_FromStringAndSize(data + start, stop - start);
        if (line == NULL || PyList_Append(lines, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(lines);
            return NULL;
        }
        Py_DECREF(line);
        if (!found)
            break;
        start = stop + 1;
    }
    return Py_BuildValue("NOn", lines, fit ? Py_True : Py_False, breaks);
}

static PyMethodDef methods[] = {
    {"thread_runs", thread_runs, METH_VARARGS, "The runs of lines of one thread in a block (stream's first pass)."},
    {"chain_links", (PyCFunction)(void (*)(void))chain_links, METH_FASTCALL, "links from a thread's first entry, its opening and tail made from the ids."},
    {"links", links, METH_VARARGS, "Verify a thread's entries over their lines, as chain.check_chain's fast path."},
    {"scan_block", scan_block, METH_VARARGS, "Count a buffer's lines and check their length and nesting (lines.scan_lines)."},
    {"split_block", split_block, METH_VARARGS, "Split a block of whole lines and check them (stream's second pass)."},
    {"context_text", (PyCFunction)(void (*)(void))context_text, METH_FASTCALL, "A context's text from the text of the one it was assigned from."},
    {"state_is", (PyCFunction)(void (*)(void))state_is, METH_FASTCALL, "Whether a snapshot's text without error hashes to the given hex digest."},
    {"entry_fields", entry_fields, METH_O, "The fields replay reads of an entry, as a tuple."},
    {"entry_ok", entry_ok, METH_O, "The strict read's checks of a decoded entry; None: the caller's to judge."},
    {"sha256_is", sha256_is, METH_VARARGS, "Whether the sha256 of the joined pieces has the given lowercase hex digest."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_digest", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__digest(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    sha256_ctx = EVP_MD_CTX_new();
    prefix = EVP_MD_CTX_new();
    if (sha256_md == NULL || sha256_ctx == NULL || prefix == NULL) {
        PyErr_SetString(PyExc_ImportError, "libcrypto has no SHA256");
        return NULL;
    }
    s_verification = PyUnicode_InternFromString("verification");
    s_entryHash = PyUnicode_InternFromString("entryHash");
    s_stateHash = PyUnicode_InternFromString("stateHash");
    s_schemaVersion = PyUnicode_InternFromString("schemaVersion");
    s_threadId = PyUnicode_InternFromString("threadId");
    if (!s_verification || !s_entryHash || !s_stateHash || !s_schemaVersion || !s_threadId)
        return NULL;
    s_index = PyUnicode_InternFromString("index");
    s_machineId = PyUnicode_InternFromString("machineId");
    s_machineVersion = PyUnicode_InternFromString("machineVersion");
    s_event = PyUnicode_InternFromString("event");
    s_metadata = PyUnicode_InternFromString("metadata");
    s_attempts = PyUnicode_InternFromString("attempts");
    s_recordedAt = PyUnicode_InternFromString("recordedAt");
    s_type = PyUnicode_InternFromString("type");
    if (!s_index || !s_machineId || !s_machineVersion || !s_event || !s_metadata || !s_attempts ||
        !s_recordedAt || !s_type)
        return NULL;
    return PyModule_Create(&module);
}
