package dlpack_test

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

func TestDataTypeNames(t *testing.T) {
	tests := []struct {
		name  string
		dtype dlpack.DataType
		size  int
	}{
		{"bool", dlpack.Bool8, 1},
		{"int8", dlpack.Int8, 1},
		{"int64", dlpack.Int64, 8},
		{"uint16", dlpack.UInt16, 2},
		{"float16", dlpack.Float16, 2},
		{"bfloat16", dlpack.BFloat16, 2},
		{"float32", dlpack.Float32, 4},
		{"complex128", dlpack.Complex128, 16},
		{"float32x4", dlpack.DataType{Code: dlpack.Float, Bits: 32, Lanes: 4}, 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.name, tc.dtype.String())
			assert.Equal(t, tc.size, tc.dtype.Size())
			parsed, err := dlpack.ParseDataType(tc.name)
			require.NoError(t, err)
			assert.Equal(t, tc.dtype, parsed)
		})
	}
}

func TestParseDataTypeRejects(t *testing.T) {
	for _, s := range []string{"", "float", "floaty32", "int0", "int300", "float32x", "float32x0", "string"} {
		t.Run(s, func(t *testing.T) {
			_, err := dlpack.ParseDataType(s)
			assert.Error(t, err)
		})
	}
}

func TestFromSlice(t *testing.T) {
	data := []int32{1, 2, 3, 4, 5, 6}
	tensor, err := dlpack.FromSlice(data, 2, 3)
	require.NoError(t, err)
	assert.Equal(t, dlpack.Int32, tensor.DType)
	assert.Equal(t, dlpack.Device{Type: dlpack.CPU}, tensor.Device)
	assert.Equal(t, []int64{2, 3}, tensor.Shape)
	assert.Equal(t, int64(6), tensor.NumElements())
	assert.Equal(t, unsafe.Pointer(&data[0]), tensor.Data, "no copy")

	flat, err := dlpack.FromSlice([]complex64{1, 2})
	require.NoError(t, err)
	assert.Equal(t, []int64{2}, flat.Shape)
	assert.Equal(t, dlpack.Complex64, flat.DType)

	_, err = dlpack.FromSlice(data, 4, 2)
	assert.ErrorContains(t, err, "8 elements")
	_, err = dlpack.FromSlice(data, -2, -3)
	assert.ErrorContains(t, err, "negative")

	empty, err := dlpack.FromSlice([]bool{}, 0, 3)
	require.NoError(t, err)
	assert.Nil(t, empty.Data)
	assert.Equal(t, dlpack.Bool8, empty.DType)
}
