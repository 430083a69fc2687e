package kernels

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// TestStatus maps what resolution returns to the TensorFlow status the kernel
// reports: the code (absl::StatusCode) and the message after the kernel's prefix.
func TestStatus(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("dsoop: library /x.so: %w", err) }
	tests := []struct {
		name     string
		err      error
		code     int
		contains string
	}{
		{"no file", wrapped(fs.ErrNotExist), codeNotFound, "the library file does not exist"},
		{"no function", wrapped(dsoop.ErrFunctionNotFound), codeNotFound, "the library has no function of that name"},
		{"no model function", &dsoop.FunctionNotFoundError{Path: "/x.so", Name: "f", Available: []string{"forward", "main"}},
			codeNotFound, "the model has no function of that name; its functions are forward, main"},
		{"data symbol", wrapped(dsoop.ErrNotCode), codeNotFound, "data, not a function"},
		{"reserved name", wrapped(dsoop.ErrReservedName), codeInvalidArgument, "reserved for TVM's own symbols"},
		{"no runtime", wrapped(dsoop.ErrRuntimeNotFound), codeFailedPrecondition, "TVM-FFI runtime"},
		{"runtime version", wrapped(dsoop.ErrRuntimeVersion), codeFailedPrecondition, "another version"},
		{"no TVM runtime", wrapped(dsoop.ErrTVMRuntimeNotLoaded), codeFailedPrecondition, "needs TVM's runtime"},
		{"no CUDA runtime", wrapped(dsoop.ErrCUDARuntimeNotLoaded), codeFailedPrecondition, "CUDA runtime did not load"},
		{"CUDA source", wrapped(dsoop.ErrCUDASourceNotCompiled), codeFailedPrecondition, "CUDA source"},
		{"model to the old op", fmt.Errorf("%w: a model", errModelNotAllowed), codeFailedPrecondition, "a model"},
		{"digest", wrapped(dsoop.ErrDigestMismatch), codePermissionDenied, "not the one the model was built with"},
		{"allow-list", wrapped(dsoop.ErrNotAllowed), codePermissionDenied, "outside the allowed folders"},
		{"TVM's error", wrapped(&dsoop.Error{Kind: "ValueError", Message: "bad shape"}), codeInvalidArgument, "ValueError: bad shape"},
		{"not a library", wrapped(dsoop.ErrNotALibrary), codeInvalidArgument, "not a loadable shared library"},
		{"old TVM's CUDA model", wrapped(dsoop.ErrLegacyUnsupported), codeUnimplemented, "TVM <= 0.21"},
		{"anything else", errors.New("something"), codeInvalidArgument, "something"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := status(func() error { return tc.err })
			assert.Equal(t, tc.code, code)
			assert.Contains(t, msg, tc.contains)
		})
	}
}

func TestStatusOfSuccessAndPanics(t *testing.T) {
	code, msg := status(func() error { return nil })
	assert.Equal(t, 0, code)
	assert.Empty(t, msg)

	code, msg = status(func() error { panic("a bug") })
	assert.Equal(t, codeInternal, code, "a recovered panic is a bug of ours, not the caller's mistake")
	assert.Equal(t, "internal error: a bug", msg)
}
