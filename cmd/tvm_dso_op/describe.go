package main

// #include <stdlib.h>
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

// libraryDescription is what TVMDSOOpDescribeLibrary tells about a library.
type libraryDescription struct {
	Model     bool     `json:"model"`               // a Relax VM executable: its functions return their outputs
	Functions []string `json:"functions,omitempty"` // a model's functions, or the library's exported ones
	CPULevel  string   `json:"cpu_level,omitempty"` // the x86-64 level loaded from a portable library
	Error     string   `json:"error,omitempty"`
}

// TVMDSOOpDescribeLibrary loads the library at path (as the op would, sharing
// the loaded copy; when sha256 is not empty, only a file of that SHA-256) and returns a malloc'ed JSON object: {"model": bool,
// "functions": [...]} or {"error": "..."}. The Python package asks it whether a
// library is a whole model, whose functions return their outputs, when it adds
// the op to a graph. Free the result with free().
//
//export TVMDSOOpDescribeLibrary
func TVMDSOOpDescribeLibrary(path, sha256 *C.char) *C.char {
	var d libraryDescription
	func() {
		// A Go panic must not unwind into the caller's C frames.
		defer func() {
			if r := recover(); r != nil {
				d = libraryDescription{Error: fmt.Sprintf("internal error: %v", r)}
			}
		}()
		// The digest is checked on the bytes read, before any of them runs. Kept
		// loaded, as the kernels keep theirs: the op shares the loaded copy.
		module, err := dsoop.OpenPinned(C.GoString(path), C.GoString(sha256))
		if err != nil {
			d.Error = err.Error()
			return
		}
		defer module.Close()
		if err := native.KeepLoaded(module); err != nil {
			d.Error = err.Error()
			return
		}
		d.CPULevel = module.CPULevel()
		d.Model = module.IsVM()
		if d.Functions, err = module.Functions(); err != nil {
			d.Error = err.Error()
		}
	}()
	out, _ := json.Marshal(d)
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
	var d inspection
	func() {
		// A Go panic must not unwind into the caller's C frames.
		defer func() {
			if r := recover(); r != nil {
				d = inspection{Error: fmt.Sprintf("internal error: %v", r)}
			}
		}()
		in, err := dsoop.Inspect(C.GoString(path))
		if err != nil {
			d.Error, d.NotFound = err.Error(), errors.Is(err, fs.ErrNotExist)
			return
		}
		d.Inspection = in
	}()
	out, _ := json.Marshal(d)
	return C.CString(string(out))
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
// "not_allowed": bool}. The
// Python Module asks it for a library the user gave no digest: it then pins
// that digest, which the op trusts. Free the result with free().
//
//export TVMDSOOpProbeLibrary
func TVMDSOOpProbeLibrary(path *C.char) *C.char {
	var r probeResult
	func() {
		// A Go panic must not unwind into the caller's C frames.
		defer func() {
			if p := recover(); p != nil {
				r = probeResult{Error: fmt.Sprintf("internal error: %v", p)}
			}
		}()
		digest, err := dsoop.Probe(C.GoString(path))
		if err != nil {
			r.Error, r.NotAllowed = err.Error(), errors.Is(err, dsoop.ErrNotAllowed)
			return
		}
		r.SHA256 = digest
	}()
	out, _ := json.Marshal(r)
	return C.CString(string(out))
}
