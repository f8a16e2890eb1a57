package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cpuTimes is the first line of /proc/stat: jiffies idle (idle + iowait)
// and in all, over every CPU.
type cpuTimes struct{ idle, total uint64 }

// readCPU reads /proc/stat; ok is false where there is none.
func readCPU() (cpuTimes, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}, false
	}
	return parseCPULine(sc.Text())
}

// parseCPULine parses "cpu  user nice system idle iowait irq softirq steal ...".
func parseCPULine(line string) (cpuTimes, bool) {
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuTimes{}, false
	}
	var t cpuTimes
	for i, s := range fields[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		if i >= 8 { // guest and guest_nice are already counted in user and nice
			break
		}
		t.total += v
		if i == 3 || i == 4 { // idle, iowait
			t.idle += v
		}
	}
	return t, true
}

// idleShare is the idle fraction of the CPUs between two readings (-1 when
// no time passed).
func idleShare(a, b cpuTimes) float64 {
	if b.total <= a.total {
		return -1
	}
	return float64(b.idle-a.idle) / float64(b.total-a.total)
}

// cpuIdle is the machine's idle CPU over a run: the mean, and the lowest
// of its one-second intervals (both -1 where /proc/stat is missing); and
// own, the share of the machine's CPUs the benchmark itself used (this
// process: client and workers; and the router process).
type cpuIdle struct{ mean, min, own float64 }

// idleSampler reads /proc/stat every second until stop.
type idleSampler struct {
	first, last cpuTimes
	low         float64
	ok          bool
	stopc       chan struct{}
	wg          sync.WaitGroup
}

func startIdleSampler() *idleSampler {
	s := &idleSampler{low: -1, stopc: make(chan struct{})}
	s.first, s.ok = readCPU()
	s.last = s.first
	if !s.ok {
		return s
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *idleSampler) sample() {
	now, ok := readCPU()
	if !ok {
		return
	}
	if v := idleShare(s.last, now); v >= 0 && (s.low < 0 || v < s.low) {
		s.low = v
	}
	s.last = now
}

// stop ends sampling and returns the run's idle CPU.
func (s *idleSampler) stop() cpuIdle {
	if !s.ok {
		return cpuIdle{-1, -1, -1}
	}
	close(s.stopc)
	s.wg.Wait()
	if now, ok := readCPU(); ok { // the last, partial interval counts in the mean only
		s.last = now
	}
	return cpuIdle{mean: idleShare(s.first, s.last), min: s.low}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ownShare is the share of the machine's CPUs that cpu over wall is.
func ownShare(cpu, wall time.Duration) float64 {
	if wall <= 0 {
		return -1
	}
	return cpu.Seconds() / (wall.Seconds() * float64(runtime.NumCPU()))
}
