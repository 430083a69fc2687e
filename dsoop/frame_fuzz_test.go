package dsoop

import (
	"testing"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// FuzzFramePack packs arbitrary tensor descriptions (ranks, sizes, stride
// counts, dtypes) and scalars into an argument frame, as every Go call does
// before reaching C: it must lay them out or refuse them, never panic or write
// past the frame. Nothing is called.
func FuzzFramePack(f *testing.F) {
	f.Add([]byte{2, 3, 4}, uint8(0), int64(7))
	f.Add([]byte{0}, uint8(2), int64(-1))
	f.Add([]byte{9, 1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(9), int64(1<<40))
	f.Fuzz(func(t *testing.T, dims []byte, strides uint8, scalar int64) {
		var args []any
		for len(dims) > 0 {
			rank := int(dims[0]) % 9
			dims = dims[1:]
			shape := make([]int64, 0, rank)
			for i := 0; i < rank && len(dims) > 0; i++ {
				shape = append(shape, int64(dims[0]))
				dims = dims[1:]
			}
			var buf [8]byte
			tensor := &dlpack.Tensor{Data: unsafe.Pointer(&buf[0]), DType: dlpack.Float32, Shape: shape,
				Strides: make([]int64, int(strides)%(len(shape)+2))}
			args = append(args, tensor, scalar, "s", nil, float32(1), true)
		}
		fr := frames.Get().(*frame)
		defer fr.release()
		if err := fr.pack(args); err != nil {
			return
		}
		if len(fr.anys) != len(args) {
			t.Fatalf("packed %d arguments of %d", len(fr.anys), len(args))
		}
	})
}
