"""Input schemas: what each column of a CTR log file is, declared once.

A Schema lists a file's columns in order; each column is one of

  Label(name)                                0 or 1, exactly one per schema
  Dense(name, transform="log1p", default=0)  a number -> float32; transform "none" or "log1p"
                                             (log(1 + max(x, 0))); default for an empty field
  Categorical(name, values="auto")           a value -> an int64 key tagged with its field
  MultiHot(name, separator="|", values=...)  a list of values -> ragged keys of its own field
  Hour(name)                                 a YYMMDDHH stamp -> two categorical fields,
                                             `<name>_hour` (0..23) and `<name>_weekday` (0..6)
  Skip(name)                                 ignored

plus the delimiter ("auto": tab if the line has one, else comma; or one character) and
whether the files have a header line (True, False, or "auto": the first line is a header
when its first field is the first column's name).

The reader (ttf.data.Reader) yields `({"ids": int64 [B, F], "dense": float32 [B, D],
<multi-hot name>: int64 ragged [B, None], ...}, label float32 [B])`: "ids" holds the
one-hot fields (Categorical and the two of each Hour) in schema order, "dense" the Dense
columns; either is left out when the schema has none. Field f's keys are
`(f << 56) | value` (see field_key): one-hot fields are 0..F-1, multi-hot fields F, F+1, ...

Schemas load from JSON (`Schema.from_json`, `load_schema("file.json")`), or by name:
`load_schema("criteo")`, `load_schema("avazu")`.
"""
import dataclasses
import json
import os

FIELD_SHIFT = 56
MISSING_VALUE = (1 << FIELD_SHIFT) - 1
MAX_FIELDS = 1 << (64 - FIELD_SHIFT - 1)  # the field sits in the top byte of a non-negative int64
_HASH_BASE = 1 << 32
_VALUE_MODES = ("auto", "int", "string")
_TRANSFORMS = ("none", "log1p")


class _Column:
    """What every column kind checks: its name (a dataclass's __post_init__; kinds with more
    settings check them after calling this)."""

    def __post_init__(self):
        name = self.name
        if not isinstance(name, str) or not name or any(c in name for c in "\t\n\r"):
            raise ValueError(f"{type(self).__name__} column name must be a non-empty string without tabs or line "
                             f"ends, got {name!r}")


@dataclasses.dataclass(frozen=True)
class Label(_Column):
    """The label column: 0 or 1 (any number equal to 0 or 1: `1`, `1.0`, `+1`)."""

    name: str
    kind = "label"


@dataclasses.dataclass(frozen=True)
class Dense(_Column):
    """A numeric column -> one float32 feature of "dense".

    Args:
      name: the column's name.
      transform: "log1p" (log(1 + max(x, 0)): counts, negatives clip to 0) or "none".
      default: the raw value of an empty field (transformed like any other).
    """

    name: str
    transform: str = "log1p"
    default: float = 0.0
    kind = "dense"

    def __post_init__(self):
        super().__post_init__()
        if self.transform not in _TRANSFORMS:
            raise ValueError(f"Dense column {self.name!r}: transform must be one of {_TRANSFORMS}, "
                             f"got {self.transform!r}")
        if not isinstance(self.default, (int, float)) or self.default != self.default or abs(self.default) == float("inf"):
            raise ValueError(f"Dense column {self.name!r}: default must be a finite number, got {self.default!r}")


@dataclasses.dataclass(frozen=True)
class Categorical(_Column):
    """A categorical column -> one int64 key per row in "ids", tagged with its field.

    Args:
      name: the column's name.
      values: how a value becomes the low 56 bits of its key:
        "auto": up to 8 hex digits are their own value (Criteo's hashed values, exact),
          any other string a 64-bit FNV-1a hash folded into [2^32, 2^56 - 1);
        "int": a decimal integer in [0, 2^56 - 1), exact (anything else is a bad line);
        "string": always the hash.
        An empty field is the missing value 2^56 - 1 in every mode.
    """

    name: str
    values: str = "auto"
    kind = "categorical"

    def __post_init__(self):
        super().__post_init__()
        if self.values not in _VALUE_MODES:
            raise ValueError(f"Categorical column {self.name!r}: values must be one of {_VALUE_MODES}, "
                             f"got {self.values!r}")


@dataclasses.dataclass(frozen=True)
class MultiHot(_Column):
    """A list of values in one column (e.g. `a|b|c`) -> a ragged int64 feature of its own
    name, [B, None] keys tagged with its own field; an empty field is an empty list. The
    models combine each row's embeddings with `combiner` ("mean" or "sum").

    Args:
      name: the column's name (and the feature's).
      separator: one character between the values (not the file's delimiter).
      values: as in Categorical.
      combiner: "mean" or "sum".
    """

    name: str
    separator: str = "|"
    values: str = "auto"
    combiner: str = "mean"
    kind = "multi_hot"

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.separator, str) or len(self.separator) != 1 or self.separator in "\n\r":
            raise ValueError(f"MultiHot column {self.name!r}: separator must be one character, got {self.separator!r}")
        if self.values not in _VALUE_MODES:
            raise ValueError(f"MultiHot column {self.name!r}: values must be one of {_VALUE_MODES}, "
                             f"got {self.values!r}")
        if self.combiner not in ("mean", "sum"):
            raise ValueError(f"MultiHot column {self.name!r}: combiner must be 'mean' or 'sum', got {self.combiner!r}")


@dataclasses.dataclass(frozen=True)
class Hour(_Column):
    """A YYMMDDHH time stamp (Avazu's `hour`: 14102100 is 2014-10-21, 00:00) -> two
    categorical fields, `<name>_hour` (0..23) and `<name>_weekday` (0 Monday .. 6 Sunday),
    whose keys hold those numbers. An empty field is missing in both."""

    name: str
    kind = "hour"

    @property
    def fields(self):
        return (f"{self.name}_hour", f"{self.name}_weekday")


@dataclasses.dataclass(frozen=True)
class Skip(_Column):
    """A column that is read past and ignored (e.g. a row id)."""

    name: str
    kind = "skip"


_KINDS = {cls.kind: cls for cls in (Label, Dense, Categorical, MultiHot, Hour, Skip)}


@dataclasses.dataclass(frozen=True)
class Schema:
    """The columns of a file, in order, and how lines are split (see the module docstring).

    Args:
      columns: a sequence of Label, Dense, Categorical, MultiHot, Hour and Skip; exactly one
        Label; names unique.
      delimiter: "auto" (a line with a tab is split on tabs, else on commas) or one character.
      header: True (the first line of every file is a header naming the columns as here),
        False (no header: a first line that names the columns is an error), or "auto"
        (a header when the first field of the first line is the first column's name).
      name: shown in error messages.

    Raises:
      ValueError: a rule above is broken, or more than 127 fields.

    Example:
      >>> import ttf
      >>> from ttf.data import Schema, Label, Dense, Categorical, MultiHot
      >>> schema = Schema([Label("click"), Dense("price", transform="none"), Categorical("user"),
      ...                  MultiHot("tags", separator="|")], delimiter=",", header=True, name="shop")
      >>> schema.fields, schema.dense_names, schema.multi_hot_names
      (('user',), ('price',), ('tags',))
    """

    columns: tuple
    delimiter: str = "auto"
    header: object = "auto"
    name: str = "custom"

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(self.columns))
        for column in self.columns:
            if type(column) not in _KINDS.values():
                raise ValueError(f"schema {self.name!r}: a column must be one of "
                                 f"{', '.join(c.__name__ for c in _KINDS.values())}, got {column!r}")
        labels = [c.name for c in self.columns if c.kind == "label"]
        if len(labels) != 1:
            raise ValueError(f"schema {self.name!r} must have exactly one Label column, got {len(labels)}")
        names = [c.name for c in self.columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"schema {self.name!r}: column names must be unique, repeated: {duplicates}")
        if self.delimiter != "auto" and (not isinstance(self.delimiter, str) or len(self.delimiter) != 1
                                         or self.delimiter in "\n\r"):
            raise ValueError(f"schema {self.name!r}: delimiter must be 'auto' or one character, got {self.delimiter!r}")
        for column in self.columns:
            if column.kind == "multi_hot" and column.separator == self.delimiter:
                raise ValueError(f"schema {self.name!r}: MultiHot column {column.name!r} uses the file's delimiter "
                                 f"{self.delimiter!r} as its separator")
        if self.header not in (True, False, "auto"):
            raise ValueError(f"schema {self.name!r}: header must be True, False or 'auto', got {self.header!r}")
        outputs = self.fields + self.dense_names + self.multi_hot_names
        clashes = sorted({n for n in outputs if outputs.count(n) > 1} | ({"ids", "dense"} & set(self.multi_hot_names)))
        if clashes:
            raise ValueError(f"schema {self.name!r}: feature names clash: {clashes}")
        if len(self.fields) + len(self.multi_hot_names) > MAX_FIELDS:
            raise ValueError(f"schema {self.name!r} has {len(self.fields) + len(self.multi_hot_names)} categorical "
                             f"fields; keys hold at most {MAX_FIELDS}")

    @property
    def label(self):
        return next(c.name for c in self.columns if c.kind == "label")

    @property
    def fields(self):
        """Names of the one-hot fields, in the order of "ids" (field f is ids[:, f])."""
        names = []
        for column in self.columns:
            if column.kind == "categorical":
                names.append(column.name)
            elif column.kind == "hour":
                names.extend(column.fields)
        return tuple(names)

    @property
    def dense_names(self):
        """Names of the Dense columns, in the order of "dense"."""
        return tuple(c.name for c in self.columns if c.kind == "dense")

    @property
    def multi_hot(self):
        return tuple(c for c in self.columns if c.kind == "multi_hot")

    @property
    def multi_hot_names(self):
        return tuple(c.name for c in self.multi_hot)

    @property
    def num_fields(self):
        return len(self.fields)

    @property
    def num_dense(self):
        return len(self.dense_names)

    def field_index(self, name):
        """The field number (key tag) of a one-hot field or a MultiHot column."""
        names = self.fields + self.multi_hot_names
        if name not in names:
            raise ValueError(f"schema {self.name!r} has no categorical field {name!r}; fields: {list(names)}")
        return names.index(name)

    def header_line(self, delimiter=None):
        """The header line of this schema's files (without a line end)."""
        delimiter = delimiter or ("," if self.delimiter == "auto" else self.delimiter)
        return delimiter.join(c.name for c in self.columns)

    def to_dict(self):
        columns = []
        for column in self.columns:
            entry = {"name": column.name, "type": column.kind}
            for f in dataclasses.fields(column):
                if f.name != "name" and getattr(column, f.name) != f.default:
                    entry[f.name] = getattr(column, f.name)
            columns.append(entry)
        return {"name": self.name, "delimiter": self.delimiter, "header": self.header, "columns": columns}

    def to_json(self, path=None):
        """The schema as JSON text; written to path when given."""
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, spec, where="schema"):
        if not isinstance(spec, dict) or not isinstance(spec.get("columns"), list):
            raise ValueError(f"{where}: expected an object with a 'columns' list")
        unknown = set(spec) - {"name", "delimiter", "header", "columns"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; expected name, delimiter, header, columns")
        columns = []
        for i, entry in enumerate(spec["columns"]):
            if not isinstance(entry, dict) or entry.get("type") not in _KINDS:
                raise ValueError(f"{where}: column {i} needs a 'type' among {sorted(_KINDS)}, got {entry!r}")
            entry = dict(entry)
            column_cls = _KINDS[entry.pop("type")]
            allowed = {f.name for f in dataclasses.fields(column_cls)}
            if set(entry) - allowed:
                raise ValueError(f"{where}: column {i} ({column_cls.__name__}) has unknown key(s) "
                                 f"{sorted(set(entry) - allowed)}; allowed: {sorted(allowed)}")
            try:
                columns.append(column_cls(**entry))
            except TypeError as err:
                raise ValueError(f"{where}: column {i}: {err}") from None
        return cls(columns, delimiter=spec.get("delimiter", "auto"), header=spec.get("header", "auto"),
                   name=spec.get("name", os.path.splitext(os.path.basename(where))[0]))

    @classmethod
    def from_json(cls, path):
        """Loads a schema from a JSON file: {"name": ..., "delimiter": ",", "header": true,
        "columns": [{"name": "click", "type": "label"}, {"name": "price", "type": "dense",
        "transform": "none"}, {"name": "user", "type": "categorical"}, ...]}.

        Raises:
          ValueError: naming the file and what is wrong with it.
        """
        path = os.fspath(path)
        try:
            with open(path) as f:
                spec = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
        except OSError as err:
            raise ValueError(f"cannot read schema file {path}: {err.strerror}") from None
        try:
            return cls.from_dict(spec, where=path)
        except ValueError as err:
            message = str(err)
            raise ValueError(message if message.startswith(path) else f"{path}: {message}") from None


def _criteo():
    return Schema([Label("label")] + [Dense(f"I{i}", transform="log1p") for i in range(1, 14)]
                  + [Categorical(f"C{i}") for i in range(1, 27)], delimiter="auto", header="auto", name="criteo")


AVAZU_COLUMNS = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
                 "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21")


def _avazu():
    columns = []
    for name in AVAZU_COLUMNS.split(","):
        if name == "id":
            columns.append(Skip(name))  # a row id: unique per row, nothing to learn
        elif name == "click":
            columns.append(Label(name))
        elif name == "hour":
            columns.append(Hour(name))
        else:
            columns.append(Categorical(name))
    return Schema(columns, delimiter=",", header=True, name="avazu")


CRITEO = _criteo()
AVAZU = _avazu()
SCHEMAS = {"criteo": CRITEO, "avazu": AVAZU}


def load_schema(name_or_path):
    """A Schema given as itself, a built-in name ("criteo", "avazu") or a JSON file.

    Raises:
      ValueError: an unknown name, or a file that is not a valid schema (naming it).

    Example:
      >>> import ttf
      >>> ttf.data.load_schema("avazu").fields[:4]
      ('hour_hour', 'hour_weekday', 'C1', 'banner_pos')
    """
    if isinstance(name_or_path, Schema):
        return name_or_path
    name_or_path = os.fspath(name_or_path)
    if name_or_path in SCHEMAS:
        return SCHEMAS[name_or_path]
    if os.path.isfile(name_or_path):
        return Schema.from_json(name_or_path)
    raise ValueError(f"unknown schema {name_or_path!r}: give one of {sorted(SCHEMAS)} or a JSON schema file")


def _fnv1a64(data):
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def field_key(field, value, values="auto"):
    """The int64 key of categorical `value` (a string) in field number `field`: a pure-Python
    statement of the contract the C++ parser implements.

    key = (field << 56) | v, where v is (values="auto") the value itself for up to 8 hex
    digits (Criteo's form: exact, no collisions; case-insensitive), a 64-bit FNV-1a hash of
    the UTF-8 bytes folded into [2^32, 2^56 - 1) for any other string; (values="int") the
    decimal integer itself, in [0, 2^56 - 1); (values="string") always the hash; and
    2^56 - 1 (MISSING_VALUE) for a missing (empty) value. The field in the top byte keeps
    fields apart, so all fields can share one embedding table.

    Raises:
      ValueError: field is not in [0, 128), or values="int" and value is not such an integer.

    Example:
      >>> import ttf
      >>> hex(ttf.data.field_key(2, "05db9164"))
      '0x200000005db9164'
      >>> ttf.data.field_key(0, "") == ttf.data.MISSING_VALUE
      True
      >>> ttf.data.field_key(1, "1005", values="int") == (1 << 56) | 1005
      True
    """
    if not 0 <= field < MAX_FIELDS:
        raise ValueError(f"field must be in [0, {MAX_FIELDS}), got {field}")
    if values not in _VALUE_MODES:
        raise ValueError(f"values must be one of {_VALUE_MODES}, got {values!r}")
    if value == "":
        v = MISSING_VALUE
    elif values == "int":
        if not (value.isascii() and value.isdigit()) or len(value) > 17 or int(value) >= MISSING_VALUE:
            raise ValueError(f"not an integer in [0, 2^56 - 1): {value!r}")
        v = int(value)
    elif values == "auto" and len(value) <= 8 and all(c in "0123456789abcdefABCDEF" for c in value):
        v = int(value, 16)
    else:
        v = _HASH_BASE + _fnv1a64(value.encode()) % (MISSING_VALUE - _HASH_BASE)
    return (field << FIELD_SHIFT) | v
