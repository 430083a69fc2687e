package dsoop

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSealMemfdAsksAgainWhileBusy: the kernel answers EBUSY to F_SEAL_WRITE
// while something holds the file's pages pinned; sealMemfd asks again, up to
// sealAttempts times, and fails at once on any other error.
func TestSealMemfdAsksAgainWhileBusy(t *testing.T) {
	tests := []struct {
		name    string
		answers []syscall.Errno
		calls   int
		err     string
	}{
		{"sealed at once", []syscall.Errno{0}, 1, ""},
		{"busy twice, then sealed", []syscall.Errno{syscall.EBUSY, syscall.EBUSY, 0}, 3, ""},
		{"busy every time", []syscall.Errno{syscall.EBUSY}, sealAttempts,
			"sealing the copy: device or resource busy (5 attempts)"},
		{"another error", []syscall.Errno{syscall.EPERM}, 1, "sealing the copy: operation not permitted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := sealMemfd(3, func(fd uintptr) syscall.Errno {
				answer := tc.answers[min(calls, len(tc.answers)-1)]
				calls++
				return answer
			})
			assert.Equal(t, tc.calls, calls)
			if tc.err == "" {
				assert.NoError(t, err)
			} else {
				assert.EqualError(t, err, tc.err)
			}
		})
	}
}
