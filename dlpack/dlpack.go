// Package dlpack is the Go view of DLPack (dlpack.h, vendored beside this file):
// data types, devices and tensor descriptors, as TVM and TensorFlow exchange them.
//
// The package is pure Go so that every other package can share its types; the
// packages that cross into C (dsoop, kernels) convert these descriptors into the C
// structs of dlpack.h at their own boundary.
package dlpack

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"
)

// DataTypeCode is DLDataTypeCode: the kind of scalar a tensor holds.
type DataTypeCode uint8

// The DLDataTypeCode values of dlpack.h that TensorFlow tensors can carry.
const (
	Int     DataTypeCode = 0
	UInt    DataTypeCode = 1
	Float   DataTypeCode = 2
	Bfloat  DataTypeCode = 4
	Complex DataTypeCode = 5
	Bool    DataTypeCode = 6
)

var codeNames = map[DataTypeCode]string{
	Int: "int", UInt: "uint", Float: "float", Bfloat: "bfloat", Complex: "complex", Bool: "bool",
}

// DataType is DLDataType: a scalar kind, its width in bits and its vector lanes.
type DataType struct {
	Code  DataTypeCode
	Bits  uint8
	Lanes uint16
}

// Common data types, named as TVM and NumPy name them.
var (
	Bool8      = DataType{Bool, 8, 1}
	Int8       = DataType{Int, 8, 1}
	Int16      = DataType{Int, 16, 1}
	Int32      = DataType{Int, 32, 1}
	Int64      = DataType{Int, 64, 1}
	UInt8      = DataType{UInt, 8, 1}
	UInt16     = DataType{UInt, 16, 1}
	UInt32     = DataType{UInt, 32, 1}
	UInt64     = DataType{UInt, 64, 1}
	Float16    = DataType{Float, 16, 1}
	Float32    = DataType{Float, 32, 1}
	Float64    = DataType{Float, 64, 1}
	BFloat16   = DataType{Bfloat, 16, 1}
	Complex64  = DataType{Complex, 64, 1}
	Complex128 = DataType{Complex, 128, 1}
)

// String names the type the way TVM does: "float32", "bool", "int8x4".
func (t DataType) String() string {
	name, ok := codeNames[t.Code]
	if !ok {
		name = fmt.Sprintf("code%d_", t.Code)
	}
	if t.Code != Bool || t.Bits != 8 {
		name += strconv.Itoa(int(t.Bits))
	}
	if t.Lanes != 1 {
		name += "x" + strconv.Itoa(int(t.Lanes))
	}
	return name
}

// Size is the number of bytes one element occupies.
func (t DataType) Size() int {
	return (int(t.Bits)*int(t.Lanes) + 7) / 8
}

// ParseDataType reads a TVM/NumPy type name ("float32", "bool", "bfloat16", "int8x4").
func ParseDataType(s string) (DataType, error) {
	// A lane count follows the bit width: "float32x4" (the x of "complex" is not one).
	base, lanesText, hasLanes := s, "", false
	if i := strings.LastIndexByte(s, 'x'); i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		base, lanesText, hasLanes = s[:i], s[i+1:], true
	}
	lanes := 1
	if hasLanes {
		l, err := strconv.Atoi(lanesText)
		if err != nil || l < 1 || l > 65535 {
			return DataType{}, fmt.Errorf("dlpack: bad lane count in data type %q", s)
		}
		lanes = l
	}
	if base == "bool" {
		return DataType{Bool, 8, uint16(lanes)}, nil
	}
	// Longest prefix first: "uint" before "int", "bfloat" before "float".
	for _, code := range []DataTypeCode{UInt, Int, Bfloat, Float, Complex} {
		prefix := codeNames[code]
		if bitsText, ok := strings.CutPrefix(base, prefix); ok {
			bits, err := strconv.Atoi(bitsText)
			if err != nil || bits < 1 || bits > 255 {
				return DataType{}, fmt.Errorf("dlpack: bad bit width in data type %q", s)
			}
			return DataType{code, uint8(bits), uint16(lanes)}, nil
		}
	}
	return DataType{}, fmt.Errorf("dlpack: unknown data type %q", s)
}

// DeviceType is DLDeviceType.
type DeviceType int32

// The device types this project hands to TVM.
const (
	CPU  DeviceType = 1
	CUDA DeviceType = 2
)

// Device is DLDevice: a device type and its ordinal.
type Device struct {
	Type DeviceType
	ID   int32
}

// Tensor describes memory the way DLTensor does. It does not own Data.
//
// Strides nil means compact row-major, as DLPack allows.
type Tensor struct {
	Data       unsafe.Pointer
	Device     Device
	DType      DataType
	Shape      []int64
	Strides    []int64
	ByteOffset uint64
}

// NumElements is the product of the shape (1 for a scalar).
func (t *Tensor) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Element is the set of Go types that map onto a DLPack data type.
type Element interface {
	~bool | ~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// DataTypeOf is the DLPack data type of a Go element type.
func DataTypeOf[T Element]() DataType {
	var zero T
	switch any(zero).(type) {
	case bool:
		return Bool8
	case int8:
		return Int8
	case int16:
		return Int16
	case int32:
		return Int32
	case int64:
		return Int64
	case uint8:
		return UInt8
	case uint16:
		return UInt16
	case uint32:
		return UInt32
	case uint64:
		return UInt64
	case float32:
		return Float32
	case float64:
		return Float64
	case complex64:
		return Complex64
	default:
		return Complex128
	}
}

// FromSlice describes a Go slice as a CPU tensor of the given shape, without a
// copy. With no shape it is a 1-D tensor of len(data). The slice must outlive
// every use of the tensor, and the caller must keep it reachable; handed to C, it
// must follow cgo's pointer rules (dsoop's calls do, for the duration of a call).
func FromSlice[T Element](data []T, shape ...int64) (*Tensor, error) {
	if len(shape) == 0 {
		shape = []int64{int64(len(data))}
	}
	t := &Tensor{Device: Device{CPU, 0}, DType: DataTypeOf[T](), Shape: shape}
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("dlpack: negative dimension in shape %v", shape)
		}
	}
	if n := t.NumElements(); n != int64(len(data)) {
		return nil, fmt.Errorf("dlpack: shape %v holds %d elements, slice has %d", shape, n, len(data))
	}
	if len(data) > 0 {
		t.Data = unsafe.Pointer(&data[0])
	}
	return t, nil
}
