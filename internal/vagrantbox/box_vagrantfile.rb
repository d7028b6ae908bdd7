# agent-vm's box Vagrantfile (embedded in every box agent-vm builds). It
# holds no values: they are in agent-vm-box.json beside it, written by
# agent-vm, so nothing is ever spliced into Ruby.
#
# agent-vm's own images have no bootloader (a whole-disk ext4, booted with
# the kernel beside it), so libvirt boots the box's kernel and initrd
# directly. A box made from an image with its own bootloader has no kernel
# in the JSON, and this sets nothing.
require "json"

box = JSON.parse(File.read(File.join(__dir__, "agent-vm-box.json")))

Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    if box["kernel"] && !box["kernel"].empty?
      libvirt.kernel = File.join(__dir__, box["kernel"])
      libvirt.initrd = File.join(__dir__, box["initrd"]) if box["initrd"] && !box["initrd"].empty?
      libvirt.cmd_line = box["cmdline"]
    end
  end
end
