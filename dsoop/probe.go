package dsoop

/*
#include "dsoop.h"
*/
import "C"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ProbeEnv names the environment variable that gives the path of
// tvmdsoop-probe, or "off" to load libraries without it. By default it is found
// beside the op library (or the executable dsoop is linked into).
const ProbeEnv = "TVMDSOOP_PROBE"

const probeName = "tvmdsoop-probe"

// The probe's exit statuses other than 0 (cmd/probe/probe.c) that are no crash.
const (
	probeRefused  = 1 // dlopen returned an error
	probeNotSetUp = 2 // the TVM runtime libraries did not open there
)

// probeTimeout bounds a probe: loading a library that hangs is refused too.
const probeTimeout = 60 * time.Second

// probePath is the probe program to run, or "" for none.
func probePath() string {
	switch explicit := getenv(ProbeEnv); {
	case explicit == "off":
		return ""
	case explicit != "":
		return explicit
	}
	candidates := []string{}
	if own := C.GoString(C.dsoop_own_file()); own != "" {
		candidates = append(candidates, filepath.Join(filepath.Dir(own), probeName))
	}
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), probeName))
	}
	for _, c := range candidates {
		if isFile(c) {
			return c
		}
	}
	return ""
}

// probePassed holds the digests of the libraries a probe loaded, so that a
// library loaded again (a copy at another path, a model version reloaded, the
// op's load after tf_op.Module's Probe) is not probed again: about 4 ms each.
var probePassed sync.Map

// probe loads the sealed library in a process of its own first (spawned, not
// forked: no TF and no Go runtime state in it), with the TVM runtime libraries
// this process uses. Structure checks cannot see a corrupted relocation or a
// constructor that aborts; a crash there ends the probe, not this process. A
// library the loader merely refuses passes: the real load reports why.
func probe(s *sealedLibrary, libs libraries) error {
	path := probePath()
	if path == "" {
		return nil
	}
	if _, passed := probePassed.Load(s.digest); passed {
		return nil // these bytes loaded there before: loading them again tells nothing new
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, libs.ffi, libs.runtime)
	cmd.ExtraFiles = []*os.File{s.file} // fd 3 in the probe
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		probePassed.Store(s.digest, true)
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: it did not finish in %v", ErrProbeFailed, probeTimeout)
	case errors.As(err, &exit):
		status, _ := exit.Sys().(syscall.WaitStatus)
		if !status.Signaled() && (status.ExitStatus() == probeRefused || status.ExitStatus() == probeNotSetUp) {
			return nil // dlopen refused it cleanly, or no probe could run: the real load says why
		}
		// A signal, or the dynamic loader's own fatal exit ("Inconsistency
		// detected by ld.so" ends the process with status 127).
		how := fmt.Sprintf("exit status %d", status.ExitStatus())
		if status.Signaled() {
			how = status.Signal().String()
		}
		return fmt.Errorf("%w: %s ended by %s (%s); refusing to load it into this process", ErrProbeFailed,
			probeName, how, strings.TrimSpace(stderr.String()))
	default:
		return nil // the probe did not start: load as without one
	}
}

// Probe tries the library at path in the probe process, as Open does before it
// loads a library with no pinned digest, without loading it here, and returns
// its SHA-256 (hex): the digest of the bytes probed, for callers that then pin
// it (the Python Module records it in the graph, and the op, given a digest,
// trusts it). A library the probe process dies of is ErrProbeFailed; one the
// structure checks refuse, ErrNotALibrary; one the loader merely refuses
// passes, as for Open (the load says why).
func Probe(path string) (string, error) {
	if strings.ContainsRune(path, 0) {
		return "", fmt.Errorf("dsoop: library path %q holds a NUL byte", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("dsoop: library %q: %w", path, err)
	}
	if err := checkAllowed(abs, getenv(AllowedDirsEnv)); err != nil {
		return "", err
	}
	if _, err := statLibrary(abs); err != nil {
		return "", err
	}
	sealed, err := sealLibrary(abs)
	if err != nil {
		return "", fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	// The level Open would load: the bytes that run are those probed.
	chosen, err := sealed.atHighestLevel(filepath.Base(abs))
	if err != nil {
		sealed.close()
		return "", fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	defer chosen.close()
	if err := Init(); err != nil {
		return "", err
	}
	initMu.Lock()
	libs := found
	initMu.Unlock()
	if err := probe(chosen, libs); err != nil {
		return "", fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	return chosen.digest, nil // the file's: a level keeps its library's
}
