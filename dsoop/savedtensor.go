package dsoop

import (
	"fmt"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// tensorMagic begins a tensor as TVM's SaveDLTensor writes it: a Relax VM
// executable's constants and relay.save_param_dict's params are both such
// tensors (include/tvm/runtime/tensor.h's kTVMTensorMagic, ndarray.h's
// kTVMNDArrayMagic before TVM 0.22).
const tensorMagic = 0xDD5E40F096B4A13F

// savedTensor is the head of a saved tensor, up to its data.
type savedTensor struct {
	deviceType, deviceID int32
	dtype                dlpack.DataType
	shape                []int64
	nbytes               int64 // the data's length, as saved
}

// readSavedTensor reads the head of a tensor as SaveDLTensor writes it,
//
//	<magic: u64> <reserved: u64> <device: i32 type, i32 id> <ndim: i32>
//	<dtype: u8 code, u8 bits, u16 lanes> <shape: ndim i64> <nbytes: i64> <data>
//
// little-endian, and leaves r at the data. Another magic, or a rank past
// maxTensorDims, fails r. What the device, dtype, shape and length may be is
// the caller's to check: TVM's loader and dsoop's params reader size the data
// differently.
func readSavedTensor(r *binReader) savedTensor {
	var t savedTensor
	if magic := r.u64(); r.err == nil && magic != tensorMagic {
		r.err = fmt.Errorf("a tensor of magic %#x", magic)
	}
	r.u64() // reserved
	t.deviceType, t.deviceID = int32(r.u32()), int32(r.u32())
	ndim := int32(r.u32())
	t.dtype = dlpack.DataType{Code: dlpack.DataTypeCode(r.u8()), Bits: r.u8(), Lanes: r.u16()}
	if r.err == nil && (ndim < 0 || ndim > maxTensorDims) {
		r.err = fmt.Errorf("a tensor of %d dimensions", ndim)
	}
	for i := int32(0); r.err == nil && i < ndim; i++ {
		t.shape = append(t.shape, r.i64())
	}
	t.nbytes = r.i64()
	return t
}
