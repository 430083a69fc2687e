package tfbridge_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"runtime/debug"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

func TestReleaseLeavesAnEmptyTensor(t *testing.T) {
	tests := []struct {
		name  string
		value any
		empty any // what the released tensor reads as
	}{
		{"float32 matrix", [][]float32{{1, 2}, {3, 4}}, []float32{}},
		{"int64 scalar", int64(7), []int64{}},
		{"strings", []string{"a", "bc"}, []string{}},
		{"a zero-length dimension", [][]float64{{}, {}}, []float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tensor, err := tf.NewTensor(tt.value)
			require.NoError(t, err)
			dtype := tensor.DataType()
			require.NoError(t, tfbridge.Release(tensor))
			assert.Equal(t, dtype, tensor.DataType())
			assert.Equal(t, []int64{0}, tensor.Shape())
			assert.Equal(t, tt.empty, tensor.Value())
			require.NoError(t, tfbridge.Release(tensor), "a released tensor can be released again")
			assert.Equal(t, []int64{0}, tensor.Shape())
		})
	}
	require.NoError(t, tfbridge.Release(nil), "nil tensors are skipped")
	assert.ErrorContains(t, tfbridge.Release(&tf.Tensor{}), "tensor 0: not a tensor made by graft")

	// A released tensor fed to a session is an empty input, not freed memory.
	session, x, y := addOneSession(t, -1)
	input, err := tf.NewTensor([]float32{1, 2, 3})
	require.NoError(t, err)
	require.NoError(t, tfbridge.Release(input))
	out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
	require.NoError(t, err)
	assert.Equal(t, []float32{}, out[0].Value())
}

// Outputs released by concurrent callers, each its own.
func TestReleaseFromConcurrentCallers(t *testing.T) {
	session, x, y := addOneSession(t, -1)
	input, err := tf.NewTensor([]float32{1, 2, 3})
	require.NoError(t, err)
	errs := make(chan error, 8)
	for range cap(errs) {
		go func() {
			for range 50 {
				out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
				if err == nil && !reflect.DeepEqual(out[0].Value(), []float32{2, 3, 4}) {
					err = fmt.Errorf("got %v", out[0].Value())
				}
				if err == nil {
					err = tfbridge.Release(out...)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
}

// A session serving add_one on 1 MiB of float32, its outputs released once read,
// writes each into memory an earlier output used: no fresh pages to fault in.
// Outputs left to Go's collector are fresh memory every run (256 pages) until it
// runs, which it does only as the Go heap grows: here, with it off, never.
func TestReleasedOutputsAreReusedWarm(t *testing.T) {
	const elements = 1 << 18
	session, x, y := addOneSession(t, elements)
	values := make([]float32, elements)
	for i := range values {
		values[i] = float32(i % 1000)
	}
	input, err := tf.NewTensor(values)
	require.NoError(t, err)

	// Each response is written into one buffer, as a server writes it out:
	// reading it with Value would allocate Go memory, and with it collections.
	var response bytes.Buffer
	response.Grow(4 * elements)
	serve := func(runs int, release bool) (faultsPerRun float64) {
		var before, after syscall.Rusage
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &before))
		for range runs {
			out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
			require.NoError(t, err)
			response.Reset()
			_, err = out[0].WriteContentsTo(&response)
			require.NoError(t, err)
			got := response.Bytes()
			require.Equal(t, []float32{1, float32((elements-1)%1000) + 1},
				[]float32{math.Float32frombits(binary.LittleEndian.Uint32(got)),
					math.Float32frombits(binary.LittleEndian.Uint32(got[len(got)-4:]))})
			if release {
				require.NoError(t, tfbridge.Release(out...))
			}
		}
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &after))
		return float64(after.Minflt-before.Minflt) / float64(runs)
	}
	// With the collector off, only Release can give an output's memory back.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	serve(20, true) // warm: TF's allocator, the kernel
	released := serve(100, true)
	collected := serve(100, false)
	t.Logf("minor page faults per run: %.1f with Release, %.1f left to the collector", released, collected)
	assert.Less(t, released, 16.0, "released outputs' memory is reused")
	assert.Greater(t, collected, 128.0, "the comparison: outputs left to the collector take fresh pages")
}

// addOneSession is a session running add_one on a float32 vector of size
// (-1: any), closed when t ends; it gives the session, its input and its output.
func addOneSession(t *testing.T, size int64) (*tf.Session, tf.Output, tf.Output) {
	t.Helper()
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(size)))
	y := mustFunc(t, "add_one").Call(s, x)[0]
	return newSession(t, s), x, y
}
