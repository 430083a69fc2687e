package kernels

/*
#include <stdlib.h>
#include "kernels/auto_settings.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/auto"
)

// The automatic clustering's side of the op library: the pass and the cluster
// kernel (auto_pass.cc, cluster_kernel.cc) call the tvmdsoopAuto* functions,
// tf_op.auto calls the TVMDSOOpAuto* ones through ctypes. No panic crosses into
// C: each recovers and reports it as the bug it is.

// TVMDSOOpAutoConfigure sets tf_op.auto's options from their JSON (auto.Options)
// and hands the C++ side its part. It returns NULL, or a malloc'ed message.
//
//export TVMDSOOpAutoConfigure
func TVMDSOOpAutoConfigure(options *C.char) (errMsg *C.char) {
	defer recoverInto(&errMsg)
	o := auto.DefaultOptions()
	decoder := json.NewDecoder(strings.NewReader(C.GoString(options)))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&o); err != nil {
		return C.CString("tf_op.auto: bad options: " + err.Error())
	}
	if err := auto.Configure(o); err != nil {
		return C.CString("tf_op.auto: " + err.Error())
	}
	C.tvmdsoop_auto_settings_set(C.TvmdsoopAutoSettings{
		enabled:          cBool(o.Enabled),
		min_cluster_size: C.int(o.MinClusterSize),
		timing_fallback:  cBool(o.TimingFallback),
		wait:             cBool(o.Wait),
		max_shapes:       C.int(o.MaxShapes),
	})
	return nil
}

// TVMDSOOpAutoOptions returns the options in force (auto.Current) as
// malloc'ed JSON, which TVMDSOOpAutoConfigure takes back.
//
//export TVMDSOOpAutoOptions
func TVMDSOOpAutoOptions() *C.char {
	return cJSON(auto.Current())
}

// TVMDSOOpAutoReport returns the report (auto.Report) as malloc'ed JSON.
//
//export TVMDSOOpAutoReport
func TVMDSOOpAutoReport() *C.char {
	return cJSON(auto.Report())
}

// cJSON returns v as malloc'ed JSON, or {"error": ...} where it has none.
func cJSON(v any) *C.char {
	out, err := json.Marshal(v)
	if err != nil {
		out, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return C.CString(string(out))
}

//export tvmdsoopAutoClusterMade
func tvmdsoopAutoClusterMade(name, graph, ops, reason *C.char) {
	defer recoverInto(nil)
	var opList []string
	if s := C.GoString(ops); s != "" {
		opList = strings.Split(s, ",")
	}
	auto.ClusterMade(C.GoString(name), C.GoString(graph), opList, C.GoString(reason))
}

//export tvmdsoopAutoShapeEvent
func tvmdsoopAutoShapeEvent(cluster, shape, status, reason *C.char, compileSeconds C.double, library, sha256 *C.char, flops C.longlong) {
	defer recoverInto(nil)
	auto.ShapeEvent(C.GoString(cluster), auto.ShapeRecord{
		Shape:          C.GoString(shape),
		Status:         C.GoString(status),
		Reason:         C.GoString(reason),
		CompileSeconds: float64(compileSeconds),
		Library:        C.GoString(library),
		SHA256:         C.GoString(sha256),
		FLOPs:          int64(flops),
	})
}

// tvmdsoopAutoCompile compiles a cluster's function (size bytes of a serialized
// FunctionDefLibrary: its function first, then those it calls) for the inputs of inputsJSON ([{"dtype": int, "shape": [...]}]),
// writing the library's path, its SHA-256 and the FLOPs of the part's
// convolutions and matmuls (the compiler's count). On failure it returns a TF status
// code and a message; every string it writes is malloc'ed for the caller to free.
//
//export tvmdsoopAutoCompile
func tvmdsoopAutoCompile(cluster, function *C.char, size C.size_t, inputsJSON *C.char, lib, sha256 **C.char, flops *C.longlong, errMsg **C.char) (code C.int) {
	defer func() {
		if r := recover(); r != nil {
			*errMsg, code = C.CString(fmt.Sprintf("internal error: %v", r)), codeInternal
		}
	}()
	var inputs []auto.Input
	if err := json.Unmarshal([]byte(C.GoString(inputsJSON)), &inputs); err != nil {
		*errMsg = C.CString("bad inputs: " + err.Error())
		return codeInternal
	}
	compiled, err := auto.Compile(C.GoString(cluster), C.GoBytes(unsafe.Pointer(function), C.int(size)), inputs, auto.Current())
	if err != nil {
		*errMsg = C.CString(err.Error())
		if errors.Is(err, auto.ErrNoPython) {
			return codeFailedPrecondition
		}
		return codeInternal
	}
	*lib, *sha256 = C.CString(compiled.Library), C.CString(compiled.SHA256)
	*flops = C.longlong(compiled.FLOPs)
	return 0
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// recoverInto turns a panic into *msg (when msg is not nil): the C++ caller
// gets an error, not a Go panic unwinding through its frames.
func recoverInto(msg **C.char) {
	if r := recover(); r != nil && msg != nil {
		*msg = C.CString(fmt.Sprintf("tf_op.auto: internal error: %v", r))
	}
}
