package libvirt

import "encoding/xml"

// The domain XML's elements, as far as Domain uses them
// (https://libvirt.org/formatdomain.html). encoding/xml escapes every
// value; an empty struct pointer is an element with no content (<acpi/>),
// nil leaves it out.

type domainXML struct {
	XMLName       xml.Name          `xml:"domain"`
	Type          string            `xml:"type,attr"`
	Name          string            `xml:"name"`
	UUID          string            `xml:"uuid"`
	GenID         *struct{}         `xml:"genid"`
	Memory        sizeXML           `xml:"memory"`
	CurrentMemory sizeXML           `xml:"currentMemory"`
	MemoryBacking *memoryBackingXML `xml:"memoryBacking"`
	VCPU          int               `xml:"vcpu"`
	SysInfo       *sysinfoXML       `xml:"sysinfo"`
	OS            osXML             `xml:"os"`
	Features      featuresXML       `xml:"features"`
	CPU           cpuXML            `xml:"cpu"`
	Clock         clockXML          `xml:"clock"`
	OnPoweroff    string            `xml:"on_poweroff"`
	OnReboot      string            `xml:"on_reboot"`
	OnCrash       string            `xml:"on_crash"`
	Devices       devicesXML        `xml:"devices"`
}

type sizeXML struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

type memoryBackingXML struct {
	Source typeXML   `xml:"source"`
	Access accessXML `xml:"access"`
}

type accessXML struct {
	Mode string `xml:"mode,attr"`
}

type typeXML struct {
	Type string `xml:"type,attr"`
}

type sysinfoXML struct {
	Type    string     `xml:"type,attr"`
	Entries []entryXML `xml:"entry"`
}

type entryXML struct {
	Name string `xml:"name,attr"`
	File string `xml:"file,attr"`
}

type osXML struct {
	Type    osTypeXML `xml:"type"`
	Kernel  string    `xml:"kernel"`
	Initrd  string    `xml:"initrd,omitempty"`
	Cmdline string    `xml:"cmdline,omitempty"`
}

type osTypeXML struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr"`
	Value   string `xml:",chardata"`
}

type featuresXML struct {
	ACPI *struct{} `xml:"acpi"`
	TCG  *tcgXML   `xml:"tcg"`
}

type tcgXML struct {
	TBCache sizeXML `xml:"tb-cache"`
}

type cpuXML struct {
	Mode  string `xml:"mode,attr"`
	Check string `xml:"check,attr,omitempty"`
}

type clockXML struct {
	Offset string `xml:"offset,attr"`
}

type devicesXML struct {
	Disks       []diskXML       `xml:"disk"`
	Controllers []controllerXML `xml:"controller"`
	Filesystems []filesystemXML `xml:"filesystem"`
	Interfaces  []interfaceXML  `xml:"interface"`
	Serials     []charXML       `xml:"serial"`
	Consoles    []charXML       `xml:"console"`
	MemBalloon  memballoonXML   `xml:"memballoon"`
	RNG         rngXML          `xml:"rng"`
}

type diskXML struct {
	Type     string        `xml:"type,attr"`
	Device   string        `xml:"device,attr"`
	Driver   diskDriverXML `xml:"driver"`
	Source   fileSourceXML `xml:"source"`
	Target   diskTargetXML `xml:"target"`
	ReadOnly *struct{}     `xml:"readonly"`
}

type diskDriverXML struct {
	Name    string `xml:"name,attr"`
	Type    string `xml:"type,attr"`
	Discard string `xml:"discard,attr,omitempty"`
}

type fileSourceXML struct {
	File string `xml:"file,attr"`
}

type diskTargetXML struct {
	Dev string `xml:"dev,attr"`
	Bus string `xml:"bus,attr"`
}

type controllerXML struct {
	Type  string `xml:"type,attr"`
	Model string `xml:"model,attr"`
}

type filesystemXML struct {
	Type   string          `xml:"type,attr"`
	Driver fsDriverXML     `xml:"driver"`
	Source socketSourceXML `xml:"source"`
	Target fsTargetXML     `xml:"target"`
}

type fsDriverXML struct {
	Type  string `xml:"type,attr"`
	Queue int    `xml:"queue,attr"`
}

type socketSourceXML struct {
	Socket string `xml:"socket,attr"`
}

type fsTargetXML struct {
	Dir string `xml:"dir,attr"`
}

type interfaceXML struct {
	Type   string           `xml:"type,attr"`
	MAC    addressXML       `xml:"mac"`
	Source networkSourceXML `xml:"source"`
	Model  typeXML          `xml:"model"`
}

type addressXML struct {
	Address string `xml:"address,attr"`
}

type networkSourceXML struct {
	Network string `xml:"network,attr"`
}

type charXML struct {
	Type   string        `xml:"type,attr"`
	Source pathSourceXML `xml:"source"`
	Target charTargetXML `xml:"target"`
}

type pathSourceXML struct {
	Path string `xml:"path,attr"`
}

type charTargetXML struct {
	Type string `xml:"type,attr,omitempty"`
	Port int    `xml:"port,attr"`
}

type memballoonXML struct {
	Model             string `xml:"model,attr"`
	FreePageReporting string `xml:"freePageReporting,attr"`
}

type rngXML struct {
	Model   string        `xml:"model,attr"`
	Backend rngBackendXML `xml:"backend"`
}

type rngBackendXML struct {
	Model string `xml:"model,attr"`
	Value string `xml:",chardata"`
}
