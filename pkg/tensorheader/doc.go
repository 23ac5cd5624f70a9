// Package tensorheader reads the headers of checkpoint files: safetensors
// (a length-prefixed JSON table) and GGUF (metadata and tensor infos), into
// the tensors they list and where their bytes are. The input is untrusted:
// every size is bounded before anything is allocated, and a header that
// does not hold is refused with an error.
package tensorheader
