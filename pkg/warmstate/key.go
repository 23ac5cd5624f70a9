package warmstate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"
)

// ErrBadKey is wrapped when a key or one of its fields is malformed.
var ErrBadKey = errors.New("warm-state key")

// The key's named fields. Other names are free-form fields.
const (
	FieldEngine      = "engine"       // the engine: vllm, triton, tensorrt-llm, …
	FieldEngineImage = "engine-image" // the engine's image digest (pins the engine, torch, Triton, CUDA)
	FieldGPU         = "gpu"          // GPU model, as the node labels it (nvidia.com/gpu.product)
	FieldCC          = "cc"           // CUDA compute capability, MAJOR.MINOR
	FieldDriver      = "driver"       // driver major version
	FieldTP          = "tp"           // tensor-parallel size
	FieldPP          = "pp"           // pipeline-parallel size
	FieldDP          = "dp"           // data-parallel size
	FieldEP          = "ep"           // expert-parallel size
	FieldRank        = "rank"         // the rank, where a cache is per rank
	FieldDType       = "dtype"        // the model's dtype
	FieldQuant       = "quant"        // quantisation
	FieldCompileHash = "compile-hash" // the engine's own cache hash (vLLM's factors hash)
)

// Bounds of a key.
const (
	MaxFields   = 32   // fields in one key
	MaxValueLen = 256  // bytes of one value
	MaxKeyLen   = 4096 // bytes of the canonical form
)

var (
	nameRE  = regexp.MustCompile(`^[a-z][a-z0-9.-]{0,62}$`)
	valueRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:+@/ -]*$`)
	intRE   = regexp.MustCompile(`^[0-9]{1,9}$`)
	ccRE    = regexp.MustCompile(`^([0-9]{1,3})\.([0-9]{1,3})$`)
)

// Key is a canonical warm-state key: field names to values. Two caches
// are interchangeable only when their keys are equal, every field.
type Key map[string]string

// ParseKey parses "k=v,k=v" (as a volume attribute writes it).
func ParseKey(s string) (Key, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("%w: empty", ErrBadKey)
	}
	if len(s) > MaxKeyLen {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrBadKey, MaxKeyLen)
	}
	return ParseFields(strings.Split(s, ","))
}

// ParseFields parses "k=v" fields (as --key flags give them) into a
// canonical key: names lower case with "_" as "-", values trimmed,
// numbers without leading zeros, engine, dtype and quant in lower case, the
// engine image a digest. A field given twice, an empty value or a
// malformed one is an error; so is a key without an engine.
func ParseFields(fields []string) (Key, error) {
	k, err := NodeFields(fields)
	if err != nil {
		return nil, err
	}
	if k[FieldEngine] == "" {
		return nil, fmt.Errorf("%w: no %s field", ErrBadKey, FieldEngine)
	}
	return k, nil
}

// NodeFields parses "k=v" fields as ParseFields does, without requiring
// an engine: the fields a node supplies (Complete).
func NodeFields(fields []string) (Key, error) {
	if len(fields) > MaxFields {
		return nil, fmt.Errorf("%w: %d fields, more than %d", ErrBadKey, len(fields), MaxFields)
	}
	k := Key{}
	for _, f := range fields {
		name, value, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%w: field %q is not NAME=VALUE", ErrBadKey, f)
		}
		name = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "_", "-")
		v, err := canonValue(name, strings.TrimSpace(value))
		if err != nil {
			return nil, err
		}
		if _, dup := k[name]; dup {
			return nil, fmt.Errorf("%w: field %q given twice", ErrBadKey, name)
		}
		k[name] = v
	}
	if len(k.String()) > MaxKeyLen {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrBadKey, MaxKeyLen)
	}
	return k, nil
}

func canonValue(name, v string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("%w: field name %q (want [a-z][a-z0-9._-]*)", ErrBadKey, name)
	}
	if v == "" || len(v) > MaxValueLen || !valueRE.MatchString(v) {
		return "", fmt.Errorf("%w: %s=%q: want 1 to %d bytes of [A-Za-z0-9._:+@/ -], starting with a letter or digit", ErrBadKey, name, v, MaxValueLen)
	}
	switch name {
	case FieldEngine, FieldDType, FieldQuant:
		return strings.ToLower(v), nil
	case FieldEngineImage:
		d, err := digest.Parse(v)
		if err != nil {
			return "", fmt.Errorf("%w: %s=%q: not a digest: %v", ErrBadKey, name, v, err)
		}
		return d.String(), nil
	case FieldDriver, FieldTP, FieldPP, FieldDP, FieldEP, FieldRank:
		if !intRE.MatchString(v) {
			return "", fmt.Errorf("%w: %s=%q: not a non-negative integer", ErrBadKey, name, v)
		}
		n, _ := strconv.Atoi(v)
		return strconv.Itoa(n), nil
	case FieldCC:
		m := ccRE.FindStringSubmatch(v)
		if m == nil {
			return "", fmt.Errorf("%w: %s=%q: want MAJOR.MINOR", ErrBadKey, name, v)
		}
		a, _ := strconv.Atoi(m[1])
		b, _ := strconv.Atoi(m[2])
		return strconv.Itoa(a) + "." + strconv.Itoa(b), nil
	}
	return v, nil
}

// String is the canonical form: the fields sorted by name, "k=v" joined
// by ",". Equal keys have equal strings.
func (k Key) String() string {
	var b strings.Builder
	for i, name := range slices.Sorted(maps.Keys(k)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name)
		b.WriteByte('=')
		b.WriteString(k[name])
	}
	return b.String()
}

// Equal reports whether k and o are the same key, every field.
func (k Key) Equal(o Key) bool { return maps.Equal(k, o) }

// Hash is the hex SHA-256 of the canonical form.
func (k Key) Hash() string {
	s := sha256.Sum256([]byte(k.String()))
	return hex.EncodeToString(s[:])
}

// Complete returns k with the fields of node it lacks (a node's GPU model,
// compute capability and driver, say). A field both have with different
// values is an error: the key asks for a cache built for other hardware
// than this node's, which it must never get.
func (k Key) Complete(node Key) (Key, error) {
	out := maps.Clone(k)
	for name, v := range node {
		if w, ok := out[name]; ok && w != v {
			return nil, fmt.Errorf("%w: %s=%s, but this node has %s=%s", ErrBadKey, name, w, name, v)
		}
		out[name] = v
	}
	if len(out) > MaxFields || len(out.String()) > MaxKeyLen {
		return nil, fmt.Errorf("%w: over %d fields or %d bytes with the node's", ErrBadKey, MaxFields, MaxKeyLen)
	}
	return out, nil
}
