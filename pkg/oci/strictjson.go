package oci

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/termsafe"
)

// keySchema describes the keys of a JSON value that encoding/json decodes
// into a Go type: the fields of a struct (nil for a map or a scalar) or,
// for an array, its elements.
type keySchema struct {
	fields map[string]*keySchema
	elem   *keySchema
}

// indexKeys is the schema of index.json.
var indexKeys = schemaOf(reflect.TypeFor[ocispec.Index]())

// schemaOf returns the schema of t from its json struct tags; embedded
// structs without a tag are inlined, as encoding/json does.
func schemaOf(t reflect.Type) *keySchema {
	switch t.Kind() {
	case reflect.Pointer:
		return schemaOf(t.Elem())
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil // base64 text
		}
		return &keySchema{elem: schemaOf(t.Elem())}
	case reflect.Struct:
		s := &keySchema{fields: map[string]*keySchema{}}
		addFields(s, t)
		return s
	}
	return nil
}

func addFields(s *keySchema, t reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			addFields(s, f.Type)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		s.fields[name] = schemaOf(f.Type)
	}
}

// checkKeys refuses JSON that encoding/json would read differently from a
// reader that takes keys as written: an object with a key twice (the last
// one wins) anywhere, or, in an object that is decoded into a struct of
// schema s, a key that matches a field only when case is ignored. It
// requires no canonical form: other tools write the file too.
func checkKeys(b []byte, s *keySchema) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return walkKeys(dec, s, "")
}

// walkKeys reads one value from dec, checking its keys; at is where it is,
// for messages.
func walkKeys(dec *json.Decoder, s *keySchema, at string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			if seen[key] {
				return fmt.Errorf("key %s twice in %s", termsafe.Short(key), where(at))
			}
			seen[key] = true
			var child *keySchema
			if s != nil && s.fields != nil {
				var ok bool
				if child, ok = s.fields[key]; !ok {
					for name := range s.fields {
						if strings.EqualFold(name, key) {
							return fmt.Errorf("key %s in %s is not %q", termsafe.Short(key), where(at), name)
						}
					}
				}
			}
			if err := walkKeys(dec, child, join(at, key)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
		return err
	case json.Delim('['):
		var elem *keySchema
		if s != nil {
			elem = s.elem
		}
		for i := 0; dec.More(); i++ {
			if err := walkKeys(dec, elem, at+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
		return err
	}
	return nil
}

func join(at, key string) string {
	if at == "" {
		return key
	}
	return at + "." + key
}

func where(at string) string {
	if at == "" {
		return "the top-level object"
	}
	return termsafe.Short(at)
}
