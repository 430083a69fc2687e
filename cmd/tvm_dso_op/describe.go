package main

// #include <stdlib.h>
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// libraryDescription is what TVMDSOOpDescribeLibrary tells about a library.
type libraryDescription struct {
	Model     bool     `json:"model"`               // a Relax VM executable or relay.build graph: its functions return their outputs
	Functions []string `json:"functions,omitempty"` // a model's functions, or the library's exported ones
	CPULevel  string   `json:"cpu_level,omitempty"` // the x86-64 level loaded from a portable library
	Error     string   `json:"error,omitempty"`
}

// TVMDSOOpDescribeLibrary loads the library at path (as the op would, sharing
// the copy loaded for kernels while there is one; when sha256 is not empty,
// only a file of that SHA-256) and returns a malloc'ed JSON object: {"model": bool,
// "functions": [...]} or {"error": "..."}. The Python package asks it whether a
// library is a whole model, whose functions return their outputs, when it adds
// the op to a graph. Free the result with free().
//
//export TVMDSOOpDescribeLibrary
func TVMDSOOpDescribeLibrary(path, sha256 *C.char) *C.char {
	return answer(func() any {
		var d libraryDescription
		// The digest is checked on the bytes read, before any of them runs. Not
		// kept: the library leaves now unless a kernel uses it, and the op loads
		// it again when it runs; a process that only describes holds nothing.
		module, err := dsoop.OpenPinned(C.GoString(path), C.GoString(sha256))
		if err != nil {
			d.Error = err.Error()
			return d
		}
		defer module.Close()
		d.CPULevel = module.CPULevel()
		d.Model = module.IsModel()
		if d.Functions, err = module.Functions(); err != nil {
			d.Error = err.Error()
		}
		return d
	})
}

// answer returns what tell gives as a malloc'ed JSON object, or {"error":
// "internal error: ..."} for a Go panic, which must not unwind into the
// caller's C frames.
func answer(tell func() any) *C.char {
	var v any
	func() {
		defer func() {
			if r := recover(); r != nil {
				v = struct {
					Error string `json:"error"`
				}{fmt.Sprintf("internal error: %v", r)}
			}
		}()
		v = tell()
	}()
	out, _ := json.Marshal(v)
	return C.CString(string(out))
}

// inspection is what TVMDSOOpInspectLibrary tells: dsoop.Inspect's
// description, or why there is none.
type inspection struct {
	*dsoop.Inspection
	Error    string `json:"error,omitempty"`
	NotFound bool   `json:"not_found,omitempty"` // the error is of a file that does not exist
}

// TVMDSOOpInspectLibrary reads what the library at path says about itself
// without loading it (dsoop.Inspect: nothing of it runs, and a library for
// another CPU is described, not refused) and returns a malloc'ed JSON object:
// dsoop.Inspection's fields, or {"error": "..."}. tvmdsoop inspect shows it,
// and tf_op.Module checks a path with it when it is made. Free the result with
// free().
//
//export TVMDSOOpInspectLibrary
func TVMDSOOpInspectLibrary(path *C.char) *C.char {
	return answer(func() any {
		in, err := dsoop.Inspect(C.GoString(path))
		if err != nil {
			return inspection{Error: err.Error(), NotFound: errors.Is(err, fs.ErrNotExist)}
		}
		return inspection{Inspection: in}
	})
}

// probeResult is what TVMDSOOpProbeLibrary tells.
type probeResult struct {
	SHA256 string `json:"sha256,omitempty"`
	Error  string `json:"error,omitempty"`
	// NotAllowed is set for a library outside TVMDSOOP_ALLOWED_DIRS: not
	// probed, and refused by the op when it loads it.
	NotAllowed bool `json:"not_allowed,omitempty"`
}

// TVMDSOOpProbeLibrary tries the library at path in the probe process
// (dsoop.Probe), without loading it here, and returns a malloc'ed JSON object:
// {"sha256": "..."}, the digest of the bytes probed, or {"error": "...",
// "not_allowed": bool}. The Python Module asks it for a library the user gave
// no digest: it then pins that digest, which the op trusts. Free the result
// with free().
//
//export TVMDSOOpProbeLibrary
func TVMDSOOpProbeLibrary(path *C.char) *C.char {
	return answer(func() any {
		digest, err := dsoop.Probe(C.GoString(path))
		if err != nil {
			return probeResult{Error: err.Error(), NotAllowed: errors.Is(err, dsoop.ErrNotAllowed)}
		}
		return probeResult{SHA256: digest}
	})
}
