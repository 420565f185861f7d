package detector

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/basin-dev/basin/collector"
)

// Loop steps a Detector on a ticker: every Every it takes a snapshot, steps the detector with it
// and hands the assessment on. The snapshot's At is the step's time; the loop itself reads no
// clock, so under testing/synctest it runs on the bubble's fake time.
type Loop struct {
	// Every is the step period (required).
	Every time.Duration
	// Detector is stepped (required).
	Detector *Detector
	// Snapshot returns the collector's current view (required).
	Snapshot func() collector.Snapshot
	// OnAssessment receives every assessment, in order, on the loop's goroutine (optional).
	OnAssessment func(Assessment)
}

// Run steps until ctx is done, then returns nil; it returns an error at once if the loop is not
// configured.
func (l *Loop) Run(ctx context.Context) error {
	switch {
	case l.Every <= 0:
		return fmt.Errorf("detector loop: Every %v, must be positive", l.Every)
	case l.Detector == nil:
		return errors.New("detector loop: Detector missing")
	case l.Snapshot == nil:
		return errors.New("detector loop: Snapshot missing")
	}
	t := time.NewTicker(l.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			a := l.Detector.Step(l.Snapshot())
			if l.OnAssessment != nil {
				l.OnAssessment(a)
			}
		}
	}
}
