package driver

import (
	"strings"
	"testing"
)

type planA struct{}

func (planA) DriverName() string { return "a" }

type planB struct{}

func (planB) DriverName() string { return "b" }

// A driver takes its own plan type and refuses another driver's, or none,
// naming both drivers.
func TestPlanOf(t *testing.T) {
	if _, err := PlanOf[planA]("a", planA{}); err != nil {
		t.Errorf("its own plan: %v", err)
	}
	_, err := PlanOf[planA]("a", planB{})
	if err == nil || !strings.Contains(err.Error(), `the a driver cannot run a plan for the "b" driver`) {
		t.Errorf("another driver's plan: %v", err)
	}
	if _, err := PlanOf[planA]("a", nil); err == nil {
		t.Error("no plan taken")
	}
}
