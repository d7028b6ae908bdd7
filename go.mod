module github.com/agent-vm/agent-vm

go 1.24.0
